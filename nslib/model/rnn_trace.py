"""Recurrent layers as cuDNN runs them, forward and backward, in a module's trace.

PyTorch's ``nn.LSTM``/``GRU``/``RNN`` on the meta device runs a step-by-step decomposition (a
dozen kernels a step, and its autograd in a training step): what a CPU runs, not what the GPU
launches. Hooks on each recurrent layer (:func:`rnn_hooks`) mute it and write cuDNN's standard
algorithm instead (:func:`rnn_rows`; in training :func:`rnn_backward_rows` through one autograd
node), all launched by the layer's one operator call. A cell (``nn.LSTMCell``, ``nn.GRUCell``)
called step by step in the module's own loop is priced the same way, one step a call: its two
GEMMs and CUDA's one fused pointwise kernel (:func:`cell_rows`, :func:`cell_backward_rows`).
Units: FLOPs, bytes (FP32).
"""
from __future__ import annotations

from nslib.model.aten import tensors_in

__all__ = ["GATES", "rnn_rows", "rnn_backward_rows", "cell_rows", "cell_backward_rows",
           "rnn_hooks", "RnnError"]

# gate GEMM widths per hidden unit of PyTorch's recurrent layers (nn.RNNBase.mode)
GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


class RnnError(ValueError):
    """A recurrent layer's input that cannot be traced (a packed sequence, an unbatched input)."""


def rnn_rows(tracer, rnn, x) -> None:
    """The kernels cuDNN's standard algorithm launches for recurrent layer ``rnn`` on input
    ``x``, appended to ``tracer``: per layer and direction one GEMM projecting every step's
    input onto the gates (``T*B x in @ in x gates*H``), then per step the recurrent GEMM
    (``B x P @ P x gates*H``) and one fused pointwise kernel over the gates (two streams in,
    one out), then, for an LSTM with ``proj_size`` P, the projection of the new hidden state
    (``B x H @ H x P``; without one P is H and there is none), the steps in sequence. PyTorch's
    own decomposition (a dozen kernels a step) is what a CPU runs, not what the GPU
    launches."""
    if x.dim() != 3:
        raise RnnError(f"{type(rnn).__name__}: only batched (3-D) inputs are traced")
    T, B = _steps_batch(rnn, x)
    H, G, P = rnn.hidden_size, GATES[rnn.mode], _state_width(rnn)
    dirs = 2 if rnn.bidirectional else 1
    aten = f"cudnn_rnn.{rnn.mode}"
    last = ()
    # one operator call launches them all (the host dispatches it once)
    saved, tracer.call = tracer.call, tracer.n_calls
    tracer.n_calls += 1
    rnn_call = tracer.call
    for layer in range(rnn.num_layers):
        width = rnn.input_size if layer == 0 else P * dirs
        for _ in range(dirs):
            step = (_gemm(tracer, aten, T * B, int(width), G * H, last),)
            for _ in range(T):
                g = _gemm(tracer, aten, B, P, G * H, step)
                step = (_pointwise(tracer, aten, B, G * H, (g,)),)
                if P != H:
                    step = (_gemm(tracer, aten, B, H, P, step),)
            last = step
    tracer.call = saved
    return rnn_call


def _state_width(rnn) -> int:
    """The width of the state a step hands the next: an LSTM's ``proj_size`` when it has
    one, else the hidden size."""
    return int(getattr(rnn, "proj_size", 0) or rnn.hidden_size)


def _gemm(tracer, aten: str, m: int, k: int, n: int, inputs) -> int:
    """Append one FP32 GEMM row ``m x k @ k x n`` (rows, reduction, outputs; FLOPs and
    bytes of its three matrices) launched by ``aten``; its kernel id."""
    return tracer.add_row(aten, "linear", "linear", (1, m, k, n, None), 2.0 * m * k * n,
                          4.0 * (m * k + k * n + m * n), inputs)


def _pointwise(tracer, aten: str, rows: int, gates: int, inputs) -> int:
    """Append the one fused pointwise kernel over a ``rows x gates`` gate tensor (two streams
    in, one out, FP32) launched by ``aten``; its kernel id."""
    return tracer.add_row(aten, "elementwise", "add", (rows, None, None, None, gates),
                          float(rows * gates), 12.0 * rows * gates, inputs)


def _steps_batch(rnn, x) -> tuple[int, int]:
    """(steps, batch) of a recurrent layer's batched input ``x``."""
    T, B = (x.shape[1], x.shape[0]) if rnn.batch_first else (x.shape[0], x.shape[1])
    return int(T), int(B)


def _cell_batch(x) -> int:
    """Rows of a cell's input: ``B x in``, or one unbatched row."""
    return int(x.shape[0]) if x.dim() == 2 else 1


def rnn_backward_rows(tracer, rnn, x, call: int, input_grad: bool,
                      weight_grad: bool = True) -> None:
    """The kernels of cuDNN's backward of recurrent layer ``rnn`` on input ``x`` (the forward's
    operator ``call``), appended to ``tracer``: layers last to first, per direction the data
    gradient step by step backwards (one fused pointwise kernel over the gates, two streams in
    and one out, then the recurrent GEMM ``B x gates*H @ gates*H x H``), the input-projection
    GEMM's data gradient (``T*B x gates*H @ gates*H x in``; the first layer's only when its
    input needs a gradient), and, when the layer's weights are trained (``weight_grad``), their
    gradients as two GEMMs over every step (``in x T*B @ T*B x gates*H`` and
    ``P x T*B @ T*B x gates*H``; the bias gradients, reductions cuDNN folds into them, are not
    rows of their own). With an LSTM's ``proj_size`` P each step first takes the projection's
    data gradient (``B x P @ P x H``), the recurrent GEMM returns P wide, and the projection's
    weight gradient (``H x T*B @ T*B x P``) is a third GEMM."""
    T, B = _steps_batch(rnn, x)
    H, G, P = rnn.hidden_size, GATES[rnn.mode], _state_width(rnn)
    dirs = 2 if rnn.bidirectional else 1
    aten = f"cudnn_rnn_backward.{rnn.mode}"
    saved, tracer.call = tracer.call, call
    last = ()
    for layer in reversed(range(rnn.num_layers)):
        width = rnn.input_size if layer == 0 else P * dirs
        for _ in range(dirs):
            step = last
            for _ in range(T):
                if P != H:
                    step = (_gemm(tracer, aten, B, P, H, step),)
                pw = _pointwise(tracer, aten, B, G * H, step)
                step = (_gemm(tracer, aten, B, G * H, P, (pw,)),)
            m = T * B
            gemms = [(m, G * H, width)] if layer > 0 or input_grad else []
            if weight_grad:
                gemms += [(width, m, G * H), (P, m, G * H)] + ([(H, m, P)] if P != H else [])
            last = step
            for a, b, c in gemms:
                last = (_gemm(tracer, aten, a, b, c, step),)
    tracer.call = saved


def _cell(mod) -> tuple[str, int] | None:
    """(kind, gates per hidden unit) of a recurrent cell CUDA runs fused (``nn.LSTMCell``,
    ``nn.GRUCell``), else None (an ``nn.RNNCell`` is two GEMMs, an add and the activation as
    traced)."""
    import torch

    if isinstance(mod, torch.nn.LSTMCell):
        return "lstm", 4
    if isinstance(mod, torch.nn.GRUCell):
        return "gru", 3
    return None


def cell_rows(tracer, cell, x) -> int:
    """The kernels one step of recurrent cell ``cell`` (``nn.LSTMCell``, ``nn.GRUCell``)
    launches on CUDA for input ``x`` (``B x in``, or one unbatched row), appended to
    ``tracer`` under one operator call (returned): the input and the state projected onto the
    gates (``B x in @ in x gates*H``, ``B x H @ H x gates*H``) and one fused pointwise kernel
    over both (``_thnn_fused_lstm_cell`` / ``_thnn_fused_gru_cell``, the biases folded in),
    not the dozen pointwise kernels of PyTorch's decomposition."""
    kind, G = _cell(cell)
    B, H = _cell_batch(x), int(cell.hidden_size)
    aten = f"_thnn_fused_{kind}_cell"
    saved, tracer.call = tracer.call, tracer.n_calls
    tracer.n_calls += 1
    call = tracer.call
    gi = _gemm(tracer, aten, B, int(cell.input_size), G * H, ())
    gh = _gemm(tracer, aten, B, H, G * H, ())
    _pointwise(tracer, aten, B, G * H, (gi, gh))
    tracer.call = saved
    return call


def cell_backward_rows(tracer, cell, x, call: int, input_grad: bool, state_grad: bool = True,
                       weight_grad: bool = True) -> None:
    """The kernels of a fused cell's backward (the forward's operator ``call``): one fused
    pointwise kernel giving the gates' gradient, then the GEMMs of the two projections' data
    gradients (input: ``B x gates*H @ gates*H x in``, when it needs one; state:
    ``B x gates*H @ gates*H x H``, when it does) and, when the weights are trained, their
    gradients (``in x B @ B x gates*H``, ``H x B @ B x gates*H``; the bias gradient is a
    reduction folded in, as for the layers)."""
    kind, G = _cell(cell)
    B, H, n_in = _cell_batch(x), int(cell.hidden_size), int(cell.input_size)
    aten = f"_thnn_fused_{kind}_cell_backward"
    saved, tracer.call = tracer.call, call
    pw = (_pointwise(tracer, aten, B, G * H, ()),)
    gemms = ([(B, G * H, n_in)] if input_grad else []) + ([(B, G * H, H)] if state_grad else [])
    if weight_grad:
        gemms += [(n_in, B, G * H), (H, B, G * H)]
    for m, k, n in gemms:
        _gemm(tracer, aten, m, k, n, pw)
    tracer.call = saved


def rnn_hooks(model, tracer, train: bool = False) -> list:
    """Hooks pricing each recurrent layer of ``model`` as :func:`rnn_rows` (its own aten calls
    muted while it runs). Training: the layer's forward runs without autograd and its outputs
    come back through one autograd node (over its input, initial state and parameters) whose
    backward writes :func:`rnn_backward_rows` (:func:`_through_cudnn_node`), so the backward
    is cuDNN's, not the autograd of PyTorch's step-by-step decomposition. A packed sequence
    is a clear error."""
    import torch

    state: dict = {}   # per layer (by id): grad mode before its forward, its operator call
    names = {id(m): n for n, m in model.named_modules()}   # rows are filed under the layer
    node_fn = _cudnn_node(tracer, state, names)

    def pre(mod, args):
        if isinstance(args[0], torch.nn.utils.rnn.PackedSequence):
            raise RnnError(f"{type(mod).__name__}: a packed sequence is not traced; give "
                           "the padded batch (batch x steps x features)")
        tracer.muted = getattr(tracer, "muted", 0) + 1
        if train:
            state[id(mod)] = (torch.is_grad_enabled(), None)
            torch.set_grad_enabled(False)

    def post(mod, args, out):
        tracer.muted -= 1
        if train:
            torch.set_grad_enabled(state[id(mod)][0])
        if tracer.muted:
            return None
        tracer.fw_stack.append(names.get(id(mod), ""))   # its own hook has popped it
        try:
            call = (cell_rows if _cell(mod) else rnn_rows)(tracer, mod, args[0])
        finally:
            tracer.fw_stack.pop()
        if not train:
            return None
        state[id(mod)] = (state[id(mod)][0], call)
        return _through_cudnn_node(tracer, node_fn, mod, args, out, call)

    handles = []
    for mod in model.modules():
        if isinstance(mod, torch.nn.RNNBase) and mod.mode in GATES:
            handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post),
                        _ShapesOnly(mod)]
        elif _cell(mod):   # one step: PyTorch's decomposition is cheap enough to run, muted
            handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    return handles


class _ShapesOnly:
    """While installed, recurrent layer ``mod`` on a batched meta input returns empty outputs
    of the shapes its forward gives, without running PyTorch's step-by-step decomposition (on
    the meta device ~0.5 ms per aten op, tens of seconds for a long sequence, and muted anyway:
    :func:`rnn_rows` writes the kernels). Anything else (an unbatched or non-meta input) runs
    the real forward. ``remove()`` puts the layer back, like a hook's
    handle."""

    def __init__(self, mod):
        self.mod, self.had = mod, mod.__dict__.get("forward")
        real = mod.forward

        def forward(x, hx=None):
            import torch

            if not (isinstance(x, torch.Tensor) and x.is_meta and x.dim() == 3):
                return real(x, hx)
            T, B = _steps_batch(mod, x)
            dirs, P = (2 if mod.bidirectional else 1), _state_width(mod)
            out = x.new_empty((B, T, dirs * P) if mod.batch_first else (T, B, dirs * P))
            h = x.new_empty((dirs * mod.num_layers, B, P))
            if mod.mode != "LSTM":
                return out, h
            return out, (h, x.new_empty((dirs * mod.num_layers, B, mod.hidden_size)))

        mod.forward = forward

    def remove(self):
        if self.had is None:
            del self.mod.forward
        else:
            self.mod.forward = self.had


def _through_cudnn_node(tracer, node_fn, mod, args, out, call):
    """The layer's outputs ``out`` passed through one autograd node (``node_fn``) over its
    input, initial state and parameters, the node and the parameters' gradient accumulators
    filed under the layer's operator ``call`` (cuDNN launches the backward from C++); ``None``
    (outputs unchanged) when nothing upstream needs a gradient."""
    import torch

    if _cell(mod):   # a cell's outputs: h, or (h, c)
        flat = list(out) if isinstance(out, tuple) else [out]
    else:            # a layer's: (output, h) or (output, (h, c))
        flat = [out[0], *(out[1] if isinstance(out[1], tuple) else (out[1],))]
    hx = [t for t in tensors_in(list(args[1:]), []) if isinstance(t, torch.Tensor)]
    tracer.muted += 1   # the node's views launch nothing
    try:
        new = node_fn.apply(mod, args[0], len(flat), len(hx), *flat, *hx, *mod.parameters())
    finally:
        tracer.muted -= 1
    if not new[0].requires_grad:
        return None
    node = new[0].grad_fn
    tracer.node_call[node] = call
    params = [id(q) for q in mod.parameters()]
    for n, _ in node.next_functions:
        if id(getattr(n, "variable", None)) in params:
            tracer.node_call[n] = call
    if _cell(mod):
        return tuple(new) if isinstance(out, tuple) else new[0]
    return new[0], (tuple(new[1:]) if isinstance(out[1], tuple) else new[1])


def _cudnn_node(tracer, state: dict, names: dict):
    """The autograd function whose backward writes a recurrent layer's cuDNN backward rows
    (:func:`rnn_backward_rows`; a cell's, :func:`cell_backward_rows`), filed under the layer's
    name in ``names`` (by id), into ``tracer`` and returns gradients of the right shapes
    (meta, no kernel). Its inputs: the layer, its input, the counts of outputs and of state
    tensors, then the outputs, the initial state tensors and the parameters."""
    import torch

    class CudnnRnn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, mod, x, n_out, n_state, *tensors):
            ctx.mod, ctx.x, ctx.call = mod, x, state[id(mod)][1]
            ctx.n_state, ctx.ins = n_state, tensors[n_out:]   # for the gradients' shapes
            ctx.set_materialize_grads(False)   # an unused output's gradient is no zeros kernel
            return tuple(t.view_as(t) for t in tensors[:n_out])

        @staticmethod
        def backward(ctx, *grads):
            need = ctx.needs_input_grad
            n_params = len(need) - 4 - len(grads) - ctx.n_state
            weight_grad = any(need[len(need) - n_params:])
            tracer.bw_stack.append(names.get(id(ctx.mod), ""))
            try:
                _backward_rows(ctx, need, grads, weight_grad)
            finally:
                tracer.bw_stack.pop()
            tracer.muted += 1   # gradients of the right shapes, no kernel of their own
            try:
                return (None, torch.empty_like(ctx.x) if need[1] else None, None, None,
                        *(None for _ in grads),
                        *(torch.empty_like(t) if n else None
                          for t, n in zip(ctx.ins, need[4 + len(grads):])))
            finally:
                tracer.muted -= 1

    def _backward_rows(ctx, need, grads, weight_grad):
        """The cell's or the layer's backward rows, as the node's inputs need them."""
        if _cell(ctx.mod):
            first = 4 + len(grads)
            cell_backward_rows(tracer, ctx.mod, ctx.x, ctx.call, input_grad=need[1],
                               state_grad=any(need[first:first + ctx.n_state]),
                               weight_grad=weight_grad)
        else:
            rnn_backward_rows(tracer, ctx.mod, ctx.x, ctx.call, input_grad=need[1],
                              weight_grad=weight_grad)

    return CudnnRnn
