"""The kernel rows of each recorded aten op, by kind: GEMMs, convolutions, elementwise,
softmax, layer norm and memory ops (the mapping choices are :mod:`nslib.model.aten`'s).

:class:`KernelRows` is the op-handling half of the tracer
(:class:`nslib.model.recorder.Tracer` mixes it in); it writes rows with the tracer's
``add_row`` and ``elem`` and follows storages with its ``producers``, ``set_writer`` and
``touch`` (:class:`nslib.model.storages.StorageTracker`).
"""
from __future__ import annotations

import math
from collections import Counter

from nslib.kernels import sizes
from nslib.model.aten import (CONV, EW_FIXED, EW_PAIR, GEMM, LAYERNORM, MEMORY, NO_KERNEL, NORM,
                              SOFTMAX, rows_of, split_name, taps_met, tensor_bytes, tensors_in)

__all__ = ["KernelRows", "WINOGRAD_TILE", "winograd_shape"]

# cuDNN's FP32 Winograd for 3x3 filters: F(4x4, 3x3) outputs per tile (Lavin & Gray 2016; the
# non-fused algorithm); F(2x2, 3x3) was the alternative (docs/decisions.md, "3x3 convolutions")
WINOGRAD_TILE = 4


# a module trace's extra column: the elements an FP32 convolution's implicit GEMM moves in
# DRAM (input, filters, output; the windows' re-reads hit L2); NaN on other rows
CONV_COLUMNS = ("dram_elems",)


def winograd_shape(w, stride, dilation, transposed: bool, groups: int) -> bool:
    """Whether a forward convolution is one cuDNN can run as a Winograd transform: a 2-D 3x3
    filter, stride 1, no dilation, not transposed, not grouped."""
    return (not transposed and groups == 1 and tuple(int(v) for v in w.shape[2:]) == (3, 3)
            and all(int(v) == 1 for v in stride) and all(int(v) == 1 for v in dilation))

# (aten base names, handler kind), first match wins
_KIND_OF = ((NO_KERNEL, "none"), (GEMM, "gemm"), (CONV, "conv"), (EW_FIXED, "ew"),
            (EW_PAIR, "ew"), (SOFTMAX, "softmax"), (LAYERNORM, "ln"), (NORM, "norm"),
            (MEMORY, "mem"))


class KernelRows:
    """Turns each aten call into zero or more kernel rows (see the module doc)."""

    def __init__(self, algorithms: bool = False):
        self.unknown: Counter = Counter()    # aten ops without a mapping -> calls
        # (kids of one form, kids of another) of an op two algorithms can run, one of them
        # priced; only in traces that ask for them (FP32 module traces: a config's trace is
        # fused, swept and split into pipeline stages, which keep every row)
        self.algorithms = algorithms
        self.alternatives: list[tuple[tuple, tuple]] = []
        self._func_info: dict = {}

    def _info(self, func) -> tuple:
        """(base name, in-place?, aten name, handler kind) of an op, memoised per trace."""
        info = self._func_info.get(func)
        if info is None:
            base, inplace = split_name(func)
            kind = next((k for names, k in _KIND_OF if base in names), "unknown")
            info = (base, inplace, str(func), kind)
            self._func_info[func] = info
        return info

    def record(self, func, args, kwargs, out):
        """Add the rows of one aten call and start the lifetimes of the storages it touches
        (none while ``muted``: a module whose kernels are written as a whole, a recurrent
        layer, runs)."""
        if getattr(self, "muted", 0):
            return
        n0 = self.n
        self._record(func, args, kwargs, out)
        if self.n > n0:
            self.touch(tensors_in((args, kwargs, out), []), self.n - 1)

    def _record(self, func, args, kwargs, out):
        base, inplace, aten, kind = self._info(func)
        if kind == "none":
            return
        ins = tensors_in(args, [])
        if kwargs:
            tensors_in(kwargs, ins)
        outs = tensors_in(out, [])
        if inplace and not outs and ins:
            outs = [ins[0]]
        if not any(t.is_meta for t in outs) and not any(t.is_meta for t in ins):
            return  # host-side work (e.g. on Python scalars wrapped as CPU tensors): no kernel

        if kind in ("gemm", "conv"):
            return (self._gemm if kind == "gemm" else self._conv)(base, aten, args, ins, outs)
        if outs and all(t.numel() == 0 for t in outs):
            return  # a kernel over no elements is not launched
        if kind in ("ln", "norm"):
            return (self._layernorm if kind == "ln" else self._norm)(base, aten, args, ins, outs)
        if kind == "ew":
            if base in EW_FIXED:
                op = EW_FIXED[base]
            else:
                dev = outs[0].device
                real = [t for t in ins if not (t.dim() == 0 and t.device != dev)]
                op = EW_PAIR[base][0 if len(real) >= 2 else 1]
            B, H = rows_of(outs[0].shape)
            self._vector(aten, "elementwise", op, B, H, ins, outs)
            return
        if kind == "softmax":
            # _softmax(x, dim, half_to_float), _softmax_backward_data(grad, out, dim, dtype)
            dim = next((a for a in args[1:] if isinstance(a, int) and not isinstance(a, bool)),
                       -1)
            H = int(outs[0].shape[dim]) if outs[0].dim() else 1
            B = outs[0].numel() // max(H, 1)
            if base == "_softmax_backward_data":
                # CUDA's softmax_backward_cuda_out forms grad * output in a buffer and kernel of
                # its own, then the row kernel reads it and the output (decisions section 6)
                self._vector(aten, "elementwise", "mul", B, H, ins, outs)
                self._vector(aten, "softmax", "softmax_bw", B, H, [*outs, *ins[1:]], outs)
                self.temporary(self.n - 2, self.n - 1, outs[0].numel() * outs[0].element_size())
                return
            # the log-softmax backward reads the gradient and the output: 1.5x the forward's bytes
            op = "logsoftmax_bw" if base.endswith("_backward_data") else "softmax"
            self._vector(aten, "softmax", op, B, H, ins, outs)
            return
        if kind == "mem":
            if base == "logsumexp":
                return self._logsumexp(aten, ins[0], outs)
            return self._memory(MEMORY[base], base, inplace, aten, args, ins, outs)
        # unknown: no row; its outputs inherit its inputs' producers
        self.unknown[aten] += 1
        self.set_writer(outs, self.producers(ins))

    def _vector(self, aten, cls, op, B, H, ins, outs):
        """One row of a measured vector op over ``B`` rows of ``H`` elements."""
        n_in, ops_per_o = sizes.OPS[op][1], sizes.OPS[op][2]
        nbytes = B * H * self.elem(outs[0] if outs else None) * (n_in + 1)
        kid = self.add_row(aten, cls, op, (B, None, None, None, H), float(B * H * ops_per_o),
                           float(nbytes), self.producers(ins))
        self.set_writer(outs, (kid,))

    def _chain(self, aten, steps, ins, outs) -> int:
        """Rows of one call that launches several kernels, each reading the one before (the
        first reads ``ins``; the last writes ``outs``). ``steps``: ``(cls, op, B, H)`` of a
        vector row, or ``("memory", n_written, bytes)`` of a memory row. Returns the last kid."""
        inputs = self.producers(ins)
        for step in steps:
            if step[0] == "memory":   # ("memory", elements written, bytes)
                kid = self.add_row(aten, "memory", "mem", (1, None, None, None, step[1]), 0.0,
                                   float(step[2]), inputs)
            else:
                cls, op, B, H = step
                n_in, per_o = sizes.OPS[op][1], sizes.OPS[op][2]
                kid = self.add_row(aten, cls, op, (B, None, None, None, H), float(B * H * per_o),
                                   float(B * H * self.elem(ins[0]) * (n_in + 1)), inputs)
            inputs = (kid,)
        self.set_writer(outs, inputs)
        return inputs[0]

    def _logsumexp(self, aten, x, outs):
        """PyTorch's logsumexp, a composite of ATen calls (``ReduceOps.cpp``): the max over the
        reduced dims; its infinities masked (abs, eq, masked_fill_); ``x - max``; exp; the sum;
        ``log_`` and ``add_`` of the max: nine kernels, three of them passes over the input."""
        n, m, e = int(x.numel()), int(outs[0].numel()), self.elem(x)
        (bn, hn), (bm, hm) = rows_of(x.shape), rows_of(outs[0].shape)
        reduce = ("memory", m, (n + m) * e)                        # amax, then the sum
        masks = [("elementwise", "mulu", bm, hm), ("memory", m, 2 * m * e),
                 ("memory", m, 2 * m * e)]                         # abs, eq, masked_fill_
        # x - max reads x (the max is m elements), then exp; log_, then add_ of the max
        self._chain(aten, [reduce, *masks, ("elementwise", "addu", bn, hn),
                           ("elementwise", "tanh", bn, hn), reduce,
                           ("elementwise", "tanh", bm, hm), ("elementwise", "add", bm, hm)],
                    [x], outs)

    def _gemm(self, base, aten, args, ins, outs):
        """One ``linear`` or ``bmm`` row of a matrix product (none when a dim is zero)."""
        if base in ("mm", "bmm", "dot", "mv"):
            a, b = args[0], args[1]
        else:  # addmm, baddbmm, addmv, _addmm_activation: (bias, a, b)
            a, b = args[1], args[2]
        if base in ("bmm", "baddbmm"):
            B, M, N = (int(s) for s in a.shape)
            K = int(b.shape[2])
            cls = "bmm"
        elif base in ("mv", "addmv"):
            B, (M, N), K, cls = 1, (int(s) for s in a.shape), 1, "linear"
        elif base == "dot":
            B, M, N, K, cls = 1, 1, int(a.shape[0]), 1, "linear"
        else:
            B, (M, N), K, cls = 1, (int(s) for s in a.shape), int(b.shape[1]), "linear"
        if min(B, M, N, K) <= 0:
            return
        flops = 2.0 * B * M * N * K
        nbytes = float(self.elem(a) * B * (M * N + N * K + M * K))
        kid = self.add_row(aten, cls, cls, (B, M, N, K, None), flops, nbytes, self.producers(ins))
        self.set_writer(outs, (kid,))

    def _conv(self, base, aten, args, ins, outs):
        """A convolution as the implicit GEMM cuDNN runs: ``(batch * output positions) x
        (in channels * kernel size) @ (... x out channels)``; the backward as the GEMMs of the
        input and weight gradients plus a reduction for the bias gradient. A transposed one:
        the implicit GEMM of its output over the (input, tap) pairs landing on each output
        position (:func:`nslib.model.aten.taps_met`, the true multiply count; no column
        matrix), its backward the convolution it inverts and that one's weight gradient. A
        forward :func:`winograd_shape` one also gets Winograd rows (:meth:`_winograd`)."""
        fw = base == "convolution"
        x, w = (args[0], args[1]) if fw else (args[1], args[2])
        y = outs[0] if fw else args[0]                       # output / its gradient
        groups, transposed = max(int(args[8] if fw else args[9]), 1), bool(args[6 if fw else 7])
        taps = math.prod(int(v) for v in w.shape[2:])
        x_pos, y_pos = (math.prod(int(v) for v in t.shape[2:]) for t in (x, y))
        M, N, K = int(y.shape[0]) * y_pos, int(w.shape[1]) * taps, int(w.shape[0]) // groups
        n_true = N
        if transposed and fw:     # weights (in, out / groups, taps): the output's GEMM
            n_true = K * taps_met(x.shape[2:], w.shape[2:], y.shape[2:], *args[3:6]) \
                / max(y_pos, 1)
            N, K = max(1, round(n_true)), int(w.shape[1])
        elif transposed:          # the inverted convolution's input and weight gradients
            M = int(x.shape[0]) * x_pos
        mask = (True, False, False) if fw else tuple(bool(m) for m in args[10])
        grads = ((M, N, K), (K, M, N)) if transposed else ((M, K, N), (K, M, N))
        gemms = [(M, N, K)] if fw else [g for g, m in zip(grads, mask) if m]
        cls, inputs, kids = "bmm" if groups > 1 else "linear", self.producers(ins), []
        fp32 = x.is_floating_point() and x.element_size() == 4
        touched = {"dram_elems": float(x.numel() + w.numel() + y.numel())} if fp32 else None
        for m, n, k in gemms:     # the multiplies counted exactly, the shape rounded
            if min(m, n, k) > 0:
                kids.append(self.add_row(aten, cls, cls, (groups, m, n, k, None), 2.0 * groups
                                         * m * (n_true if fw else n) * k, float(
                                             self.elem(x) * groups * (m * n + n * k + m * k)),
                                         inputs, touched))
        if (self.algorithms and kids and fw and fp32
                and winograd_shape(w, args[3], args[5], transposed, groups)):
            wino = self._winograd(aten, x, w, y, inputs)
            self.alternatives.append((tuple(kids), wino))
            kids = [kids[0], wino[-1]]   # the output's writer is either form's last kernel
        if not fw and len(mask) > 2 and mask[2]:
            written = int(y.shape[1])    # one per output channel
            kids.append(self.add_row(aten, "memory", "mem", (1, None, None, None, written), 0.0,
                                     float(tensor_bytes(y) + written * y.element_size()), inputs))
        if kids:
            self.set_writer(outs, tuple(kids))

    def _winograd(self, aten, x, w, y, inputs) -> tuple:
        """A 3x3 stride-1 convolution as cuDNN's non-fused FP32 Winograd F(m x m, 3x3), ``m`` =
        :data:`WINOGRAD_TILE`, ``a = m + 2``: the filter transform (the 3x3 filters read, their
        ``a^2``-point transforms written), the input transform (input read, ``a^2`` transformed
        points of every tile and input channel written), ``a^2`` independent GEMMs ``tiles x in
        channels @ in channels x out channels`` (one ``bmm`` row), the output transform (``a^2``
        products read, the output written). ``tiles`` = batch x output positions / m^2,
        rounded up per side. 36 multiplies per 16 outputs and input channel instead of 144.
        Written beside the implicit GEMM as its alternative (``alternatives``): the GPU's
        datasheet picks one (:func:`nslib.model.inputs.kernel_frame`). Returns the kids, each
        kernel reading the one before."""
        m = WINOGRAD_TILE
        a2 = (m + 2) ** 2
        n, cin, cout = int(x.shape[0]), int(x.shape[1]), int(w.shape[0])
        tiles = n * math.prod(-(-int(v) // m) for v in y.shape[2:])
        e = self.elem(x)
        filt = self.add_row(aten, "memory", "mem", (1, None, None, None, a2 * cin * cout), 0.0,
                            float(e * (9 + a2) * cin * cout), inputs)
        tin = self.add_row(aten, "memory", "mem", (1, None, None, None, a2 * tiles * cin), 0.0,
                           float(tensor_bytes(x) + e * a2 * tiles * cin), inputs)
        gemm = self.add_row(aten, "bmm", "bmm", (a2, tiles, cin, cout, None),
                            2.0 * a2 * tiles * cin * cout,
                            float(e * a2 * (tiles * cin + cin * cout + tiles * cout)),
                            (filt, tin))
        tout = self.add_row(aten, "memory", "mem", (1, None, None, None, int(y.numel())), 0.0,
                            float(tensor_bytes(y) + e * a2 * tiles * cout), (gemm,))
        return filt, tin, gemm, tout

    def _norm(self, base, aten, args, ins, outs):
        """A batch norm as one elementwise row over its output (``add``, two streams read, when
        it computes batch statistics; ``addu`` with running ones); a group norm as an ``ln``
        row of ``N x groups`` rows of ``C / groups x positions`` elements. Backward: a batch norm
        that computed batch statistics launches a reduction (the per-channel sums of the
        gradient and of gradient x input, two streams read) and the elementwise pass writing the
        input gradient (an ``add`` row each); with running statistics the second is a scale
        (``mulu``), and the sums are there only for a trained weight or bias; the input
        gradient's pass only when the input needs one. A group norm's input gradient is a layer
        norm's backward row (``ln_bw``)."""
        if base.endswith("_backward"):
            self._norm_backward(base, aten, args, ins, outs)
            return
        x = args[0]
        e = self.elem(x)
        if base == "native_group_norm":  # (input, weight, bias, N, C, HxW, group, eps)
            n, c, hw, g = (int(args[i]) for i in (3, 4, 5, 6))
            # the row moments (read x, write a mean and rstd per group); with a weight or bias
            # and more than one position, the per-channel scale and shift; then the apply
            steps = [("memory", 2 * n * g, (int(x.numel()) + 2 * n * g) * e)]
            if hw > 1 and (args[1] is not None or args[2] is not None):
                steps.append(("memory", 2 * n * c, (2 * n * g + 4 * n * c) * e))
            steps.append(("layernorm", "ln", n * g, c // max(g, 1) * hw))
            self._chain(aten, steps, ins, outs[:1])
            return
        training = base == "_native_batch_norm_legit_functional" or (
            base != "_native_batch_norm_legit_no_training" and bool(args[5]))
        B, H = rows_of(x.shape)
        if training and x.dim() < 3 and base != "cudnn_batch_norm":
            # PyTorch runs cuDNN's (one kernel) from three dims up; a 2-D input takes ATen's
            # own: the batch's statistics, the running statistics' update, the apply
            c = int(x.shape[1]) if x.dim() > 1 else 1
            running = hasattr(args[3], "shape")
            steps = [("memory", 2 * c, (int(x.numel()) + 2 * c) * e)]
            if running:
                steps.append(("memory", 2 * c, 6 * c * e))
            self._chain(aten, steps + [("elementwise", "addu", B, H)], ins, outs[:1])
            return
        self._vector(aten, "elementwise", "add" if training else "addu", B, H, ins, outs[:1])

    def _norm_backward(self, base, aten, args, ins, outs):
        """The rows of a batch or group norm's backward (:meth:`_norm`)."""
        if base == "native_group_norm_backward":  # (grad, input, mean, rstd, weight, N, C, HxW, g)
            n, c, hw, g = (int(args[i]) for i in (5, 6, 7, 8))
            self._vector(aten, "layernorm", "ln_bw", n * g, c // max(g, 1) * hw, ins, outs[:1])
            return
        # native: (grad, input, weight, running mean/var, saved mean/invstd, train, ...);
        # cuDNN's: (input, grad, ...), always after a training forward
        cudnn = base == "cudnn_batch_norm_backward"
        x = args[0] if cudnn else args[1]
        B, H = rows_of(x.shape)
        training = cudnn or bool(args[7])
        mask = (True, True, True) if cudnn else tuple(bool(m) for m in args[9])
        if training or mask[1] or mask[2]:   # the per-channel sums
            self._vector(aten, "elementwise", "add", B, H, ins, [] if mask[0] else outs[1:])
        if mask[0]:
            self._vector(aten, "elementwise", "add" if training else "mulu", B, H, ins,
                         outs[:1])

    def _layernorm(self, base, aten, args, ins, outs):
        """An ``ln`` row forward; backward the input-gradient row and the weight/bias one."""
        fw = not base.endswith("_backward")
        if fw:
            x, normalized = args[0], args[1]
        else:
            x, normalized = args[1], args[2]
        H = math.prod(int(s) for s in normalized) if len(normalized) else 1
        B = x.numel() // max(H, 1)
        if fw:
            self._vector(aten, "layernorm", "ln", B, H, ins, outs)
            return
        mask = args[-1] if isinstance(args[-1], (list, tuple)) else [True, True, True]
        inputs = self.producers(ins)
        res = outs  # (grad_input, grad_weight, grad_bias); undefined ones are absent
        if mask[0]:
            # grad_input reads the output gradient and the input, writes one: 1.5x the forward
            _, n_in, ops_per_o = sizes.OPS["ln_bw"]
            kid = self.add_row(aten, "layernorm", "ln_bw", (B, None, None, None, H),
                               float(B * H * ops_per_o),
                               float(B * H * self.elem(x) * (n_in + 1)), inputs)
            if res:
                self.set_writer(res[:1], (kid,))
        n_param = int(bool(mask[1])) + int(len(mask) > 2 and bool(mask[2]))
        if n_param:
            # weight/bias grads: a column reduction that reads the output gradient and the
            # input (B x H each) and writes H per parameter; part of the layer norm's backward
            nbytes = float(self.elem(x) * (2 * B * H + n_param * H))
            kid = self.add_row(aten, "layernorm", "ln_wgrad", (B, None, None, None, H),
                               float(B * H * sizes.OPS["ln_wgrad"][2]), nbytes, inputs)
            self.set_writer(res[1:] if mask[0] else res, (kid,))

    def _memory(self, kind, base, inplace, aten, args, ins, outs):
        """One ``memory`` row: the bytes a copy, gather, scatter, fill or reduction moves."""
        written = sum(int(t.numel()) for t in outs)
        wbytes = sum(tensor_bytes(t) for t in outs)
        if kind == "write":  # fills and RNG: nothing read
            rbytes = 0
            inputs = ()
        elif kind == "gather":
            idx = [t for t in ins if not t.is_floating_point()]
            # at least one source element per integer index (nll_loss: one per target)
            rbytes = sum(tensor_bytes(t) for t in idx) + max(wbytes, sum(
                t.numel() for t in idx if t.element_size() > 1) * self.elem(outs[0]))
            inputs = self.producers(ins)
        elif kind == "scatter":
            # (self, ..., index, src): reads index and src, read-modify-writes src-many rows
            src = [t for t in ins[1:] if t.is_floating_point()] or ins[1:]
            idx = [t for t in ins[1:] if not t.is_floating_point()]
            sbytes = sum(tensor_bytes(t) for t in src)
            rbytes = sum(tensor_bytes(t) for t in idx) + sbytes
            if inplace:  # only the touched rows are read and written
                written = sum(int(t.numel()) for t in src)
                wbytes = sbytes
            else:  # the out-of-place form first copies `self` into the output
                rbytes += tensor_bytes(ins[0])
            inputs = self.producers(ins)
        elif kind == "embedding_backward":
            grad, idx = args[0], args[1]
            rbytes = tensor_bytes(grad) + tensor_bytes(idx)
            inputs = self.producers(ins)
        elif kind == "grad":  # a pooling backward: its forward input gives the shape only
            rbytes = sum(tensor_bytes(t) for t in ins if t is not args[1])
            inputs = self.producers(ins)
        else:  # "all"
            srcs = ins[1:] if base == "copy" else ins
            rbytes = sum(tensor_bytes(t) for t in srcs)
            inputs = self.producers(ins)
        if written <= 0:
            return
        kid = self.add_row(aten, "memory", "mem", (1, None, None, None, written), 0.0,
                           float(rbytes + wbytes), inputs)
        self.set_writer(outs, (kid,))

