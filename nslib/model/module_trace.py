"""Trace any PyTorch module (not only a HuggingFace config) into the kernels it launches.

The second front door of the tracer: the same recorder and kernel rows as
:func:`nslib.model.trace.trace`, over a module and inputs built on the ``meta`` device (no
weights, no memory). KernelBench's problem files (a ``Model`` class, ``get_inputs()`` and
``get_init_inputs()``, the convention of its benchmark) load through :func:`load_problem`.
"""
from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import pandas as pd

from nslib.model.aten import tensors_in
from nslib.model.blocks import install_hooks
from nslib.model.recorder import Tracer, make_modes
from nslib.model.trace import mark_storages

__all__ = ["trace_module", "load_problem", "problem_trace", "meta_trace", "run_file",
           "ProblemError", "rnn_rows", "rnn_backward_rows", "unpriced_calls", "module_loss"]

# gate GEMM widths per hidden unit of PyTorch's recurrent layers (nn.RNNBase.mode)
GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


class ProblemError(ValueError):
    """A problem file or module that cannot be built or traced on the meta device."""


def trace_module(model, inputs, mode: str = "inf", eval_mode: bool = True,
                 grad_accumulation: bool = False) -> pd.DataFrame:
    """The kernel rows (:data:`nslib.model.recorder.TRACE_COLUMNS` plus the memory columns) of
    one step of ``model`` on ``inputs`` (a list of meta tensors or other arguments), FP32.

    ``mode="inf"``: one forward under ``no_grad``, in eval mode unless ``eval_mode=False``
    (the module's own flag then decides: batch norms computing batch statistics, dropout on).
    ``mode="train"``: the forward in train mode and the backward of :func:`module_loss` (phase
    ``bw``): a ones gradient into the module's output, every trainable parameter's gradient
    computed (the inputs', as data, not); ``grad_accumulation`` pre-sets each ``.grad`` so the
    adds of a step that accumulates gradients are traced too (a step after
    ``zero_grad(set_to_none=True)``, the default here, has none). The optimizer step is not
    traced. The module's train/eval flags and gradients are restored afterwards.
    Unknown aten ops give no row; they are listed in ``frame.attrs["unknown_ops"]`` (op ->
    calls)."""
    import torch

    if mode not in ("inf", "train"):
        raise ValueError(f"trace_module traces mode 'inf' or 'train', got {mode!r}")
    train = mode == "train"
    # the caller's module comes back as it was: train/eval flags and gradients
    flags = [(m, m.training) for m in model.modules()]
    grads = [(q, q.grad) for q in model.parameters()]
    if train:
        model.train(True)
    elif eval_mode:
        model.train(False)
    if train:
        with torch.no_grad():
            for prm, _ in grads:
                # accumulating adds into an existing gradient; a zeroed step has none
                prm.grad = torch.zeros_like(prm) if grad_accumulation and prm.requires_grad \
                    else None
    tracer = Tracer(model, block_of={})
    recorder, calls = make_modes(tracer, redirect_dropout=train)
    mark_storages(tracer, model, [t for t in inputs if isinstance(t, torch.Tensor)])
    handles = install_hooks(model, tracer) + _rnn_hooks(model, tracer, train)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.set_grad_enabled(train), recorder, calls:
                out = model(*inputs)
                held = [t for t in tensors_in(out, []) if isinstance(t, torch.Tensor)]
                tracer.mark(held, "held")
                if train:
                    loss = module_loss(out)
                    tracer.phase = "bw"
                    tracer.fw_stack.clear()
                    try:
                        loss.backward()
                    except RuntimeError as e:
                        raise ProblemError(
                            f"its backward failed ({str(e).splitlines()[0][:160]}): PyTorch "
                            "cannot train this module as written (e.g. an in-place operation "
                            "on a tensor the backward needs); its inference forward can be "
                            "forecast") from None
    finally:
        tracer.closed = True
        for h in handles:
            h.remove()
        for m, flag in flags:
            m.training = flag
        for prm, g in grads:
            prm.grad = g
    frame = tracer.frame()
    frame.attrs["unknown_ops"] = dict(tracer.unknown)
    return frame


def module_loss(out):
    """The scalar a module's training trace backpropagates: the sum of its first floating-point
    output that needs a gradient (one reduction kernel; a real loss adds a few vector kernels
    over that output). A ValueError when no output needs one (no parameter to train)."""
    import torch

    for t in tensors_in(out, []):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad:
            return t.sum()
    raise ProblemError("the module returned no floating-point output that depends on a "
                       "trainable parameter: nothing to train (use mode 'inf')")


def unpriced_calls(trace: pd.DataFrame) -> tuple[dict, float]:
    """``(aten op -> calls without a kernel mapping, their share of the traced operator
    calls)`` of a :func:`trace_module` frame: a call counts once however many kernel rows it
    launched (a recurrent layer's hundreds of steps are one call)."""
    unknown = dict(trace.attrs.get("unknown_ops", {}))
    n_unknown = sum(unknown.values())
    n_calls = int(trace["call"].nunique()) if "call" in trace.columns else len(trace)
    return unknown, n_unknown / max(n_unknown + n_calls, 1)


def rnn_rows(tracer, rnn, x) -> None:
    """The kernels cuDNN's standard algorithm launches for recurrent layer ``rnn`` on input
    ``x``, appended to ``tracer``: per layer and direction one GEMM projecting every step's
    input onto the gates (``T*B x in @ in x gates*H``), then per step the recurrent GEMM
    (``B x H @ H x gates*H``) and one fused pointwise kernel over the gates (two streams in,
    one out), the steps in sequence. PyTorch's own decomposition (a dozen kernels a step) is
    what a CPU runs, not what the GPU launches."""
    if x.dim() != 3:
        raise ProblemError(f"{type(rnn).__name__}: only batched (3-D) inputs are traced")
    T, B = (x.shape[1], x.shape[0]) if rnn.batch_first else (x.shape[0], x.shape[1])
    H, G = rnn.hidden_size, GATES[rnn.mode]
    dirs = 2 if rnn.bidirectional else 1
    aten = f"cudnn_rnn.{rnn.mode}"
    last = ()
    # one operator call launches them all (the host dispatches it once)
    saved, tracer.call = tracer.call, tracer.n_calls
    tracer.n_calls += 1
    rnn_call = tracer.call
    for layer in range(rnn.num_layers):
        width = rnn.input_size if layer == 0 else H * dirs
        for _ in range(dirs):
            m, n, k = int(T * B), int(width), int(G * H)
            kid = tracer.add_row(aten, "linear", "linear", (1, m, n, k, None), 2.0 * m * n * k,
                                 4.0 * (m * n + n * k + m * k), last)
            step = (kid,)
            for _ in range(int(T)):
                g = tracer.add_row(aten, "linear", "linear", (1, B, H, G * H, None),
                                   2.0 * B * H * G * H, 4.0 * (B * H + H * G * H + B * G * H),
                                   step)
                step = (tracer.add_row(aten, "elementwise", "add", (int(B), None, None, None,
                                       int(G * H)), float(B * G * H), 12.0 * B * G * H, (g,)),)
            last = step
    tracer.call = saved
    return rnn_call


def rnn_backward_rows(tracer, rnn, x, call: int, input_grad: bool,
                      weight_grad: bool = True) -> None:
    """The kernels of cuDNN's backward of recurrent layer ``rnn`` on input ``x`` (the forward's
    operator ``call``), appended to ``tracer``: layers last to first, per direction the data
    gradient step by step backwards (one fused pointwise kernel over the gates, two streams in
    and one out, then the recurrent GEMM ``B x gates*H @ gates*H x H``), the input-projection
    GEMM's data gradient (``T*B x gates*H @ gates*H x in``; the first layer's only when its
    input needs a gradient), and, when the layer's weights are trained (``weight_grad``), their
    gradients as two GEMMs over every step (``in x T*B @ T*B x gates*H`` and
    ``H x T*B @ T*B x gates*H``; the bias gradients, reductions cuDNN folds into them, are not
    rows of their own)."""
    T, B = (x.shape[1], x.shape[0]) if rnn.batch_first else (x.shape[0], x.shape[1])
    T, B = int(T), int(B)
    H, G = rnn.hidden_size, GATES[rnn.mode]
    dirs = 2 if rnn.bidirectional else 1
    aten = f"cudnn_rnn_backward.{rnn.mode}"
    saved, tracer.call = tracer.call, call
    last = ()
    for layer in reversed(range(rnn.num_layers)):
        width = rnn.input_size if layer == 0 else H * dirs
        for _ in range(dirs):
            step = last
            for _ in range(T):
                pw = tracer.add_row(aten, "elementwise", "add", (B, None, None, None, G * H),
                                    float(B * G * H), 12.0 * B * G * H, step)
                step = (tracer.add_row(aten, "linear", "linear", (1, B, G * H, H, None),
                                       2.0 * B * G * H * H,
                                       4.0 * (B * G * H + G * H * H + B * H), (pw,)),)
            m = T * B
            gemms = [(m, G * H, width)] if layer > 0 or input_grad else []
            if weight_grad:
                gemms += [(width, m, G * H), (H, m, G * H)]
            last = step
            for a, b, c in gemms:
                last = (tracer.add_row(aten, "linear", "linear", (1, a, b, c, None),
                                       2.0 * a * b * c, 4.0 * (a * b + b * c + a * c), step),)
    tracer.call = saved


def _rnn_hooks(model, tracer, train: bool = False) -> list:
    """Hooks pricing each recurrent layer of ``model`` as :func:`rnn_rows` (its own aten calls
    muted while it runs). Training: the layer's forward runs without autograd and its outputs
    come back through one autograd node (over its input, initial state and parameters) whose
    backward writes :func:`rnn_backward_rows`, so the backward is cuDNN's, not the autograd of
    PyTorch's step-by-step decomposition. A packed sequence is a clear error."""
    import torch

    state: dict = {}   # per layer (by id): grad mode before its forward, its operator call

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
            rnn_backward_rows(tracer, ctx.mod, ctx.x, ctx.call, input_grad=need[1],
                              weight_grad=any(need[len(need) - n_params:]))
            tracer.muted += 1   # gradients of the right shapes, no kernel of their own
            try:
                ins = ctx.ins
                return (None, torch.empty_like(ctx.x) if need[1] else None, None, None,
                        *(None for _ in grads),
                        *(torch.empty_like(t) if n else None
                          for t, n in zip(ins, need[4 + len(grads):])))
            finally:
                tracer.muted -= 1

    def pre(mod, args):
        tracer.muted = getattr(tracer, "muted", 0) + 1
        if isinstance(args[0], torch.nn.utils.rnn.PackedSequence):
            tracer.muted -= 1
            raise ProblemError(f"{type(mod).__name__}: a packed sequence is not traced; give "
                               "the padded batch (batch x steps x features)")
        if train:
            state[id(mod)] = (torch.is_grad_enabled(), None)
            torch.set_grad_enabled(False)

    def post(mod, args, out):
        tracer.muted -= 1
        if train:
            torch.set_grad_enabled(state[id(mod)][0])
        if tracer.muted:
            return None
        call = rnn_rows(tracer, mod, args[0])
        if not train:
            return None
        state[id(mod)] = (state[id(mod)][0], call)
        flat = [out[0], *(out[1] if isinstance(out[1], tuple) else (out[1],))]
        hx = [t for t in tensors_in(list(args[1:]), []) if isinstance(t, torch.Tensor)]
        ins = [*hx, *mod.parameters()]
        tracer.muted += 1   # the node's views launch nothing
        try:
            new = CudnnRnn.apply(mod, args[0], len(flat), len(hx), *flat, *ins)
        finally:
            tracer.muted -= 1
        if not new[0].requires_grad:   # nothing upstream needs a gradient: no backward
            return None
        # the backward is the layer's call (cuDNN launches it from C++), and so are its
        # parameters' gradient accumulators
        node = new[0].grad_fn
        tracer.node_call[node] = call
        params = [id(q) for q in mod.parameters()]
        for n, _ in node.next_functions:
            if id(getattr(n, "variable", None)) in params:
                tracer.node_call[n] = call
        rest = tuple(new[1:]) if isinstance(out[1], tuple) else new[1]
        return new[0], rest

    handles = []
    for mod in model.modules():
        if isinstance(mod, torch.nn.RNNBase) and mod.mode in GATES:
            handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    return handles


def run_file(path: str | Path) -> dict:
    """The namespace of a Python file, run once; :class:`ProblemError` naming the file when it
    cannot be read or raises."""
    path = Path(path)
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ProblemError(f"{path}: cannot read the file ({e})") from None
    ns: dict = {"__name__": f"nslib_problem_{hashlib.sha1(source.encode()).hexdigest()[:12]}",
                "__file__": str(path)}
    try:
        exec(compile(source, str(path), "exec"), ns)  # noqa: S102 - the user's own file
    except Exception as e:  # a user's file can raise anything at import
        raise ProblemError(f"{path}: running the file failed ({type(e).__name__}: "
                           f"{str(e)[:200]})") from None
    return ns


def load_problem(path: str | Path) -> dict:
    """The namespace of a KernelBench-style problem file: its ``Model`` class and its
    ``get_inputs`` / ``get_init_inputs`` functions. Raises :class:`ProblemError` naming the file
    when it cannot be run or lacks one of the three."""
    ns = run_file(path)
    missing = [k for k in ("Model", "get_inputs", "get_init_inputs") if not callable(ns.get(k))]
    if missing:
        raise ProblemError(f"{path}: a problem file defines Model, get_inputs() and "
                           f"get_init_inputs(); missing {', '.join(missing)}")
    return ns


def meta_trace(build, make_inputs, label: str, eval_mode: bool = True, mode: str = "inf"
               ) -> pd.DataFrame:
    """:func:`trace_module` (``mode``) of ``build()`` on ``make_inputs()``, both called under
    ``torch.device("meta")`` (tensors the forward makes without a device stay on meta too).
    :class:`ProblemError` starting with ``label`` that says which step failed: building the
    module, making its inputs, or its forward (wrong input shapes, or a module that needs real
    data: a data-dependent shape, a CPU-only op)."""
    import torch

    def why(e: Exception) -> str:
        first = str(e).splitlines()[0][:200] if str(e) else ""
        return f"{type(e).__name__}: {first}"

    def needs_data(e: Exception) -> bool:
        # a meta tensor has no values: reading one is what a data-dependent module does
        return any(w in str(e) for w in ("meta", "data-dependent", ".item()", "nonzero",
                                         "Cannot copy out"))

    data_hint = ("a module that reads tensor values (data-dependent shapes, Python numbers "
                 "from tensors) needs real data, which this meta-device trace does not have")

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model = build()
        except ProblemError:
            raise
        except Exception as e:  # the user's constructor raises anything
            raise ProblemError(f"{label}: building the module failed ({why(e)})"
                               + (f"; {data_hint}" if needs_data(e) else "")) from None
        try:
            inputs = [t.to("meta") if isinstance(t, torch.Tensor) else t for t in make_inputs()]
        except ProblemError:
            raise
        except Exception as e:
            raise ProblemError(f"{label}: making its inputs failed ({why(e)})") from None
        try:
            return trace_module(model, inputs, mode, eval_mode=eval_mode)
        except ProblemError as e:
            raise ProblemError(f"{label}: {e}") from None
        except Exception as e:  # the module's own code raises anything on meta tensors
            shapes = ", ".join("x".join(str(d) for d in t.shape) if isinstance(t, torch.Tensor)
                               else type(t).__name__ for t in inputs) or "none"
            hint = data_hint if needs_data(e) else \
                "check that the input shapes are the ones the module expects"
            what = "forward" if mode == "inf" else "forward or backward"
            raise ProblemError(f"{label}: its {what} failed on the meta device with inputs "
                               f"[{shapes}] ({why(e)}); {hint}") from None


def problem_trace(path: str | Path) -> pd.DataFrame:
    """:func:`meta_trace` of a problem file's ``Model(*get_init_inputs())`` on
    ``get_inputs()``, the module left in the mode it is built in (training, as KernelBench's
    harness calls it)."""
    ns = load_problem(path)
    return meta_trace(lambda: ns["Model"](*ns["get_init_inputs"]()), ns["get_inputs"],
                      Path(path).name, eval_mode=False)
