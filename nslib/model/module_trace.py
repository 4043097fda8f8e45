"""Trace any PyTorch module (not only a HuggingFace config) into the kernels it launches.

The second front door of the tracer: the same recorder and kernel rows as
:func:`nslib.model.trace.trace`, over a module and inputs built on the ``meta`` device (no
weights, no memory). KernelBench's problem files (a ``Model`` class, ``get_inputs()`` and
``get_init_inputs()``, the convention of its benchmark) load through :func:`load_problem`.
"""
from __future__ import annotations

import contextlib
import hashlib
import traceback
import warnings
from pathlib import Path

import pandas as pd

from nslib.model.aten import tensors_in
from nslib.model.blocks import install_hooks
from nslib.model.meta_devices import on_meta
from nslib.model.recorder import Tracer, make_modes
from nslib.model.rnn_trace import RnnError, rnn_hooks
from nslib.model.trace import mark_storages

__all__ = ["trace_module", "load_problem", "problem_trace", "meta_trace", "run_file",
           "ProblemError", "unpriced_calls", "module_loss"]


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
    calls). ``frame.attrs["bool_reads"]``: the boolean tensor values the module read (a branch
    on data, ``if x.sum() > 0``), each taken as True: a meta tensor has no values;
    ``frame.attrs["other_floats"]``: floating dtypes other than FP32 among the parameters,
    buffers and inputs (the rows are FP32 kernels all the same); ``frame.attrs["autocast"]``:
    the module entered CUDA autocast, which turns itself off without a GPU (the rows are FP32)."""
    import torch

    if mode not in ("inf", "train"):
        raise ValueError(f"trace_module traces mode 'inf' or 'train', got {mode!r}")
    train = mode == "train"
    # a module's step is priced on one GPU's frame (kernel_frame) without fusion or
    # pipeline stages: it may carry a convolution's alternative algorithms
    tracer = Tracer(model, block_of={}, algorithms=True)
    recorder, calls = make_modes(tracer, redirect_dropout=train)
    with _as_it_was(model):
        _set_up(model, train, eval_mode, grad_accumulation)
        mark_storages(tracer, model, [t for t in inputs if isinstance(t, torch.Tensor)])
        handles = install_hooks(model, tracer) + rnn_hooks(model, tracer, train)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("default")   # kept, not shown: autocast's looked for
                with torch.set_grad_enabled(train), recorder, calls:
                    out = model(*inputs)
                    tracer.mark([t for t in tensors_in(out, []) if isinstance(t, torch.Tensor)],
                                "held")
                    if train:
                        _backward(tracer, module_loss(out))
        except RnnError as e:
            raise ProblemError(str(e)) from None
        finally:
            tracer.closed = True
            for h in handles:
                h.remove()
    frame = tracer.frame()
    # torch.autocast("cuda") turns itself off without a GPU: the step ran in FP32
    frame.attrs["autocast"] = any("Disabling autocast" in str(w.message) for w in caught)
    frame.attrs["unknown_ops"] = dict(tracer.unknown)
    frame.attrs["bool_reads"] = tracer.bool_reads
    tensors = [*model.parameters(), *model.buffers(),
               *(t for t in inputs if isinstance(t, torch.Tensor))]
    frame.attrs["other_floats"] = sorted({str(t.dtype).removeprefix("torch.") for t in tensors
                                          if t.is_floating_point() and t.dtype != torch.float32})
    return frame


@contextlib.contextmanager
def _as_it_was(model):
    """Give the caller's module back as it was: its train/eval flags and gradients."""
    flags = [(m, m.training) for m in model.modules()]
    grads = [(q, q.grad) for q in model.parameters()]
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag
        for prm, g in grads:
            prm.grad = g


def _set_up(model, train: bool, eval_mode: bool, grad_accumulation: bool) -> None:
    """The module's flags and gradients for the step: train mode for a training step (its
    gradients zeros when they accumulate, none after ``zero_grad``), eval mode for an
    inference unless ``eval_mode=False``."""
    import torch

    if train or eval_mode:
        model.train(train)
    if train:
        with torch.no_grad():
            for prm in model.parameters():
                prm.grad = torch.zeros_like(prm) if grad_accumulation and prm.requires_grad \
                    else None


def _backward(tracer, loss) -> None:
    """The backward of ``loss``, traced as phase ``bw``; a backward PyTorch refuses is a
    :class:`ProblemError` saying so."""
    tracer.phase = "bw"
    tracer.fw_stack.clear()
    try:
        loss.backward()
    except RuntimeError as e:
        raise ProblemError(f"its backward failed ({str(e).splitlines()[0][:160]}): PyTorch "
                           "cannot train this module as written (e.g. an in-place operation "
                           "on a tensor the backward needs); its inference forward can be "
                           "forecast") from None


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
    except SystemExit as e:   # a script's own sys.exit() would end nslib without a word
        raise ProblemError(f"{path}: the file called sys.exit({e.code!r}) while it ran; a module "
                           "file defines the module and its inputs, and runs nothing at import "
                           "(put a script's own code under `if __name__ == \"__main__\":`)"
                           ) from None
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
        import torch

        named = [k for k, v in ns.items() if isinstance(v, type) and k != "Model"
                 and issubclass(v, torch.nn.Module) and v.__module__ == ns.get("__name__")]
        other = (f"; or name a module class or factory: {path}:{named[0]} --inputs SHAPES"
                 if named else "; or name a module class or factory: FILE.py:NAME --inputs "
                 "SHAPES")
        raise ProblemError(f"{path}: a problem file defines Model, get_inputs() and "
                           f"get_init_inputs(); missing {', '.join(missing)}{other}")
    return ns


DATA_HINT = ("a module that reads tensor values (data-dependent shapes, Python numbers "
             "from tensors) needs real data, which this meta-device trace does not have")


def shortened(text: str, limit: int) -> str:
    """``text`` cut at a word boundary to at most ``limit`` characters, an ellipsis marking
    the cut: a message or a table cell kept to one readable line."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " ..."


def _why(e: Exception) -> str:
    """``Type: first line`` of an exception, a long line cut at a word (and said so)."""
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {shortened(first, 300)}"


def _needs_data(e: Exception) -> bool:
    """Whether ``e`` came from reading a meta tensor's values (a data-dependent module)."""
    return any(w in str(e) for w in ("meta", "data-dependent", ".item()", "nonzero",
                                     "Cannot copy out"))


def _input_hint(e: Exception) -> str:
    """What to check when the forward fails on the inputs: their integer type for an
    embedding's ids, else their shapes."""
    text = str(e)
    if "Long" in text and ("Int" in text or "indices" in text):
        return ("token ids and indices need an integer type: give that input as "
                "8x512:int64 (--inputs) or a torch.long tensor")
    return CUDA_HINT if _calls_cuda(e) else "check that the input shapes are the ones the " \
        "module expects"


# a torch.cuda call (synchronize, current_device, streams) needs a GPU; tensors do not
CUDA_HINT = ("the module calls a torch.cuda function, which needs a GPU (its tensors' devices "
             "do not: they all trace on meta); guard the call with `if "
             "torch.cuda.is_available():` or leave it out")


def _calls_cuda(e: Exception) -> bool:
    """Whether ``e`` came from a ``torch.cuda`` call on a machine without CUDA."""
    return "not compiled with CUDA" in str(e) or "No CUDA GPUs" in str(e)


def _build_hint(e: Exception) -> str:
    """What to change when building the module fails ("" when nothing specific)."""
    if isinstance(e, TypeError) and "required positional argument" in str(e):
        return ("; the module is built with no arguments: name a zero-argument factory "
                "instead (def make(): return Net(...), then FILE.py:make), or use "
                "KernelBench's convention (Model, get_inputs(), get_init_inputs())")
    if _calls_cuda(e):
        return f"; {CUDA_HINT}"
    return f"; {DATA_HINT}" if _needs_data(e) else ""


def meta_trace(build, make_inputs, label: str, eval_mode: bool = True, mode: str = "inf"
               ) -> pd.DataFrame:
    """:func:`trace_module` (``mode``) of ``build()`` on ``make_inputs()``, both called under
    ``torch.device("meta")`` and :func:`nslib.model.meta_devices.on_meta` (every tensor on
    meta, whatever device the code names: ``.cuda()``, ``device="cuda"``).
    :class:`ProblemError` starting with ``label`` that says which step failed: building the
    module, making its inputs, or its forward (wrong input shapes, or a module that needs real
    data: a data-dependent shape, a CPU-only op)."""
    import torch

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _built(build, label)
        with on_meta():
            return _traced(model, make_inputs, label, mode, eval_mode)


def _traced(model, make_inputs, label: str, mode: str, eval_mode: bool) -> pd.DataFrame:
    """:func:`meta_trace`'s inputs and trace, on the meta device (its errors said)."""
    import torch

    try:
        inputs = [t.to("meta") if isinstance(t, torch.Tensor) else t for t in make_inputs()]
    except ProblemError:
        raise
    except (Exception, SystemExit) as e:
        raise ProblemError(f"{label}: making its inputs failed ({_why(e)})") from None
    try:
        return trace_module(model, inputs, mode, eval_mode=eval_mode)
    except ProblemError as e:
        raise ProblemError(f"{label}: {e}") from None
    except (Exception, SystemExit) as e:  # the module's code raises anything on meta
        shapes = ", ".join(_described(t) for t in inputs) or "none"
        if any(f.name == "pack_padded_sequence"
               for f in traceback.extract_tb(e.__traceback__)):
            raise ProblemError(f"{label}: a packed sequence is not traced (its lengths "
                               "are data); give the recurrent layers the padded batch "
                               "(batch x steps x features)") from None
        hint = DATA_HINT if _needs_data(e) else _input_hint(e)
        what = "forward" if mode == "inf" else "forward or backward"
        raise ProblemError(f"{label}: its {what} failed on the meta device with inputs "
                           f"[{shapes}] ({_why(e)}); {hint}") from None


def _built(build, label: str):
    """``build()`` with every tensor on meta (:func:`nslib.model.meta_devices.on_meta`). A
    constructor that reads tensor values (``[x.item() for x in torch.linspace(0, rate,
    depth)]``, common in vision transformers) fails there; it is built again with its small
    tensors on the CPU and the module then moved to meta. :class:`ProblemError` naming the
    first failure."""
    try:
        with on_meta():
            return build()
    except ProblemError:
        raise
    except (Exception, SystemExit) as e:  # the user's constructor raises anything
        first = e
    if _needs_data(first):
        model = None
        with contextlib.suppress(Exception, SystemExit), on_meta(small_on_cpu=True):
            model = build()
        if model is not None:
            return model.to("meta") if hasattr(model, "to") else model
    raise ProblemError(f"{label}: building the module failed ({_why(first)})"
                       + _build_hint(first)) from None


def _described(t) -> str:
    """An input as an error message shows it: ``8x64`` (FP32), ``8x64:int64``, or its type."""
    import torch

    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    dtype = str(t.dtype).removeprefix("torch.")
    return "x".join(str(d) for d in t.shape) + ("" if dtype == "float32" else f":{dtype}")


def problem_trace(path: str | Path) -> pd.DataFrame:
    """:func:`meta_trace` of a problem file's ``Model(*get_init_inputs())`` on
    ``get_inputs()``, the module left in the mode it is built in (training, as KernelBench's
    harness calls it)."""
    ns = load_problem(path)
    return meta_trace(lambda: ns["Model"](*ns["get_init_inputs"]()), ns["get_inputs"],
                      Path(path).name, eval_mode=False)
