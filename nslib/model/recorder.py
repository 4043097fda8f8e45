"""The recorder: a ``TorchDispatchMode`` that hands every aten op a model runs on ``meta`` to
a :class:`Tracer`, which keeps one row per kernel (:data:`TRACE_COLUMNS`).

The tracer knows which module runs each op (the hooks of :mod:`nslib.model.blocks` keep its
stacks) and so the transformer block; it maps ops to kernel rows with
:class:`~nslib.model.kernel_rows.KernelRows` and follows storages with
:class:`~nslib.model.storages.StorageTracker`. :func:`make_modes` also returns the
``TorchFunctionMode`` that runs ``F.dropout`` as CUDA does (see :mod:`nslib.model.aten`).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from nslib.kernels import sizes
from nslib.model.aten import tensors_in
from nslib.model.kernel_rows import CONV_COLUMNS, KernelRows
from nslib.model.sdpa_trace import ATTENTION_COLUMNS
from nslib.model.storages import StorageTracker

__all__ = ["TRACE_COLUMNS", "Tracer", "make_modes"]

TRACE_COLUMNS = ("kid", "phase", "aten", "cls", "op", "B", "M", "N", "K", "H", "flops", "bytes",
                 "inputs", "layer", "module", "call")


class Tracer(KernelRows, StorageTracker):
    """The rows of one trace, with the module context each kernel runs in."""

    def __init__(self, model, block_of: dict, half: bool = False, algorithms: bool = False):
        KernelRows.__init__(self, algorithms=algorithms and not half)
        StorageTracker.__init__(self)
        # 16-bit traces: real element sizes, and the attention rows' extra columns
        self.half = half
        self.extra_cols = ATTENTION_COLUMNS if half else (CONV_COLUMNS if algorithms else ())
        self.rows: dict[str, list] = {c: [] for c in TRACE_COLUMNS + self.extra_cols}
        self.phase = "fw"
        self.fw_stack: list[str] = []
        self.bw_stack: list[str] = []
        self.block_of = block_of
        self._layer_cache: dict[str, int] = {}
        self.n = 0
        # the PyTorch operator call (a torch function or tensor method) running now, and the
        # forward call that made each autograd node, so backward kernels join their operator
        self.call = -1
        self.n_calls = 0
        self.node_call: dict = {}
        self.bool_reads = 0   # boolean tensor values read (each answered True: _meta_scalar)

    # --- module context --------------------------------------------------------------------
    def current_module(self) -> str:
        """Qualified name of the innermost module running now, or ""."""
        stack = self.bw_stack if self.phase == "bw" else self.fw_stack
        return stack[-1] if stack else ""

    def layer_of(self, name: str) -> int:
        """Index of the transformer block holding module ``name``, or -1."""
        hit = self._layer_cache.get(name)
        if hit is None:
            hit = -1
            parts = name.split(".")
            for i in range(len(parts), 0, -1):
                idx = self.block_of.get(".".join(parts[:i]))
                if idx is not None:
                    hit = idx
                    break
            self._layer_cache[name] = hit
        return hit

    # --- operator calls ----------------------------------------------------------------------
    def current_call(self) -> int:
        """Index of the operator call a kernel launched now belongs to, or -1: the top-level
        call running in the forward; in the backward, the forward call whose autograd node is
        running (``-1`` for the engine's own work, e.g. the ones gradient it starts from)."""
        if self.phase != "bw":
            return self.call
        import torch

        node = torch._C._current_autograd_node()
        return -1 if node is None else self.node_call.get(node, -1)

    def tag_nodes(self, out, call: int) -> None:
        """File the autograd nodes ``call`` created (those between its outputs and the nodes
        already filed) under ``call``. A parameter's gradient accumulator goes to the first
        call that reads the parameter, as a per-operator profile times the accumulation with
        the operator's backward."""
        todo = [t.grad_fn for t in tensors_in(out, []) if t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None or node in self.node_call:
                continue
            self.node_call[node] = call
            todo.extend(n for n, _ in node.next_functions)

    # --- rows --------------------------------------------------------------------------------
    def elem(self, t) -> int:
        """Bytes per element a kernel on ``t`` is counted with: the FP32 constant of the
        measurements in an FP32 trace (today's rows, unchanged), ``t``'s own size in a 16-bit
        trace (FP32 islands such as the upcast inside RMSNorm stay 4 bytes)."""
        if not self.half or t is None or not t.is_floating_point():
            return sizes.BYTES_PER_ELEM
        return int(t.element_size())

    def add_row(self, aten, cls, op, dims, flops, nbytes, inputs, extra=None) -> int:
        """Append one kernel row (``dims`` = B, M, N, K, H; None for NaN); returns its kid."""
        kid = self.n
        self.n += 1
        mod = self.current_module()
        r = self.rows
        r["kid"].append(kid)
        r["phase"].append(self.phase)
        r["aten"].append(aten)
        r["cls"].append(cls)
        r["op"].append(op)
        for c, v in zip(("B", "M", "N", "K", "H"), dims):
            r[c].append(np.nan if v is None else float(v))
        r["flops"].append(flops)
        r["bytes"].append(nbytes)
        r["inputs"].append(tuple(k for k in inputs if k != kid))
        r["layer"].append(self.layer_of(mod) if mod else -1)
        r["module"].append(mod)
        r["call"].append(self.current_call())
        for c in self.extra_cols:
            r[c].append(float((extra or {}).get(c, np.nan)))
        return kid

    def frame(self) -> pd.DataFrame:
        """The trace: the rows, then the memory columns, then any extra columns."""
        df = pd.DataFrame(self.rows, columns=list(TRACE_COLUMNS + self.extra_cols))
        df["kid"] = df["kid"].astype(np.int64)
        df["layer"] = df["layer"].astype(np.int64)
        df["call"] = df["call"].astype(np.int64)
        for c in ("B", "M", "N", "K", "H", "flops", "bytes") + self.extra_cols:
            df[c] = df[c].astype(np.float64)
        extra = df[list(self.extra_cols)]
        out = pd.concat([df.drop(columns=list(self.extra_cols)), self.memory_frame(), extra],
                        axis=1)
        if self.alternatives:
            out.attrs["alternatives"] = list(self.alternatives)
        return out


def _same_dense(args, kwargs):
    """The first tensor argument when every tensor argument is a contiguous floating meta
    tensor of one shape and dtype (the output of an elementwise op is then ``empty_like`` of
    it), else None."""
    import torch

    first = None
    for a in args:
        if isinstance(a, torch.Tensor):
            if first is None:
                if not (a.is_meta and a.is_floating_point() and a.is_contiguous()):
                    return None
                first = a
            elif a.shape != first.shape or a.dtype != first.dtype or not a.is_contiguous():
                return None
        elif isinstance(a, (list, tuple, dict)):
            return None
    if kwargs:
        for v in kwargs.values():
            if isinstance(v, (torch.Tensor, list, tuple, dict)):
                return None
    return first


def _fast_meta_ops():
    """Ops whose meta output is computed here instead of by torch's Python meta kernels (the
    main cost of a trace): shape-preserving elementwise ops on same-shape contiguous inputs."""
    import torch

    aten = torch.ops.aten
    same = [aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor,
            aten.add.Scalar, aten.sub.Scalar, aten.mul.Scalar, aten.div.Scalar,
            aten.rsub.Scalar, aten.pow.Tensor_Scalar, aten.relu.default, aten.tanh.default,
            aten.gelu.default, aten.sigmoid.default, aten.silu.default, aten.neg.default,
            aten.rsqrt.default, aten.exp.default, aten.threshold_backward.default,
            aten.tanh_backward.default, aten.gelu_backward.default,
            aten.sigmoid_backward.default, aten.silu_backward.default,
            aten._softmax.default, aten._softmax_backward_data.default]
    inplace = [aten.add_.Tensor, aten.mul_.Tensor, aten.div_.Tensor, aten.add_.Scalar,
               aten.mul_.Scalar, aten.div_.Scalar]
    fast = {}

    def out_like(args, kwargs):
        t = _same_dense(args, kwargs)
        return None if t is None else torch.empty_like(t)

    def out_self(args, kwargs):
        t = _same_dense(args, kwargs)
        return None if t is None else args[0]

    def dropout(args, kwargs):
        x = args[0] if args else None
        if kwargs or not (isinstance(x, torch.Tensor) and x.is_meta and x.is_contiguous()):
            return None
        return torch.empty_like(x), torch.empty_like(x, dtype=torch.bool)

    def dropout_backward(args, kwargs):
        g, m = args[0], args[1]
        if kwargs or not (g.is_meta and g.is_contiguous() and m.is_contiguous()
                          and g.shape == m.shape and g.is_floating_point()):
            return None
        return torch.empty_like(g)

    for op in same:
        fast[op] = out_like
    for op in inplace:
        fast[op] = out_self
    fast[aten.native_dropout.default] = dropout
    fast[aten.native_dropout_backward.default] = dropout_backward
    return fast


def _meta_scalar(t, tracer):
    """``.item()`` of a meta tensor: the only data-dependent checks the models make on their
    inputs ask whether the mask is all ones / the positions are not packed (``.all()``); our
    inputs have no padding, so a boolean answers True (counted in ``tracer.bool_reads``: a
    module's own branch on data is taken the same way). Anything else cannot be traced."""
    import torch

    if t.dtype == torch.bool:
        tracer.bool_reads += 1
        return True
    raise ValueError("the model reads a data-dependent value (.item() on a non-boolean tensor), "
                     "which a meta-device trace cannot provide: patch that module for tracing")


@lru_cache(maxsize=1)
def _products() -> frozenset:
    """The aten matrix products and convolutions (:func:`_check_one_dtype`)."""
    import torch

    aten = torch.ops.aten
    return frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default,
                      aten.baddbmm.default, aten.mv.default, aten.addmv.default,
                      aten.convolution.default})


def _check_one_dtype(func, args) -> None:
    """A matrix product or convolution (:func:`_products`) of tensors of different dtypes (an
    integer input into ``nn.Linear``) fails on a GPU, but torch's meta kernels return a float
    result: refuse it here, as CUDA would, instead of pricing a step that cannot run."""
    import torch

    if func not in _products():
        return
    dtypes = [a.dtype for a in args if isinstance(a, torch.Tensor)]
    if len(set(dtypes)) > 1:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{func.__name__.split('.')[0]} of tensors of different dtypes "
                         f"({names}): PyTorch refuses it on a GPU. Pass inputs of the "
                         "parameters' dtype (e.g. float32 for nn.Linear, int64 token ids "
                         "only into nn.Embedding)")


def make_modes(tracer: Tracer | None, redirect_dropout: bool):
    """(the recording ``TorchDispatchMode`` of ``tracer``, the ``TorchFunctionMode`` filing
    each kernel under the operator call that launched it and, if ``redirect_dropout``, running
    ``F.dropout`` as CUDA does; enter it last, so it sees the model's own calls before any
    other function mode). With ``tracer`` None it only redirects dropout."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is local_scalar and args and args[0].is_meta:
                return _meta_scalar(args[0], tracer)
            _check_one_dtype(func, args)
            shortcut = fast.get(func)
            out = shortcut(args, kwargs) if shortcut is not None else None
            if out is None:
                out = func(*args, **kwargs)
            tracer.record(func, args, kwargs, out)
            return out

    dropouts = {F.dropout, torch.dropout}
    local_scalar = torch.ops.aten._local_scalar_dense.default
    fast = _fast_meta_ops()

    def cuda_dropout(func, args, kwargs):
        """F.dropout as CUDA runs it: the fused native_dropout kernel when 0 < p < 1."""
        names = ("input", "p", "training", "inplace") if func is F.dropout else \
                ("input", "p", "train")
        bound = {**dict(zip(names, args)), **kwargs}
        x = bound["input"]
        p = float(bound.get("p", 0.5))
        train = bool(bound.get("training", bound.get("train", True)))
        if not train or p == 0.0 or x.numel() == 0:
            return x
        if 0.0 < p < 1.0:
            return torch.native_dropout(x, p, True)[0]
        return func(*args, **kwargs)

    class Calls(TorchFunctionMode):
        # torch disables this mode while its handler runs, so only top-level calls land here
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            run = cuda_dropout if redirect_dropout and func in dropouts else \
                (lambda f, a, k: f(*a, **k))
            if tracer is None or tracer.phase == "bw":
                return run(func, args, kwargs)
            call, tracer.call = tracer.call, tracer.n_calls
            tracer.n_calls += 1
            try:
                out = run(func, args, kwargs)
            finally:
                cid, tracer.call = tracer.call, call
            if torch.is_grad_enabled():
                tracer.tag_nodes(out, cid)
            return out

    return (Recorder() if tracer is not None else None), Calls()
