"""Forecast any PyTorch module: the second front door of :func:`nslib.model.predict.predict_model`.

A module (an ``nn.Module``, a factory that returns one, or a Python file) is built on the
``meta`` device and traced by :func:`nslib.model.module_trace.trace_module`, the recorder the
HuggingFace path uses; its kernels are priced on the GPU's datasheet like any model step
(:func:`nslib.model.stream.step_ms`), each operator call dispatched once by the host and its
further kernels launched from C++ (:func:`nslib.model.stream.library_launch_ms`).

A file is either KernelBench's convention (``Model``, ``get_inputs()``,
``get_init_inputs()``) or ``FILE.py:NAME``, ``NAME`` a module class or a factory taking no
arguments, with the inputs given as shapes. Inputs are FP32 tensors; an inference forward
(``no_grad``) or a training step (forward and the backward of the output's sum, every
parameter's gradient; no optimizer step) is what is traced.

Aten ops without a kernel mapping are listed with their share of the traced calls
(``unpriced``, ``unpriced_share``); a step whose calls are mostly unpriced is an error, not a
number. Units: ms.
"""
from __future__ import annotations

import copy
import numbers
import re
from pathlib import Path

import pandas as pd

from nslib.data.settings import Settings, settings_of
from nslib.model.inputs import get_predictor, kernel_frame, resolve_gpu
from nslib.model.module_trace import (ProblemError, load_problem, meta_trace, run_file,
                                      unpriced_calls)
from nslib.model.stream import (LAUNCH_US, HostFloor, faster_of, power_bound, step_ms,
                                 step_summary, stream_terms)
from nslib.model.tf32 import tensor_for, tf32_gpu_ms, tf32_peak

__all__ = ["is_module_spec", "module_trace_of", "predict_module", "priced_frame",
           "parse_shapes", "Shape", "MAX_UNPRICED_SHARE"]

# more than this share of the traced operator calls without a kernel mapping: no forecast
MAX_UNPRICED_SHARE = 0.5
# FILE.py or FILE.py:NAME (the path itself may hold colons, e.g. a drive letter); anything
# ending in .py or .py:... is taken for a module, and a bad name is then told apart
SPEC = re.compile(r"(?P<path>.+\.py)(?::(?P<name>[A-Za-z_]\w*))?")
LOOSE = re.compile(r".+\.py(:.*)?")


def is_module_spec(model) -> bool:
    """Whether ``model`` names a module rather than a model config: an ``nn.Module``, a
    callable (a module class or factory), or a path to a ``.py`` file (``FILE.py[:NAME]``)."""
    if isinstance(model, dict):
        return False
    if isinstance(model, (str, Path)):
        return LOOSE.fullmatch(str(model)) is not None
    try:
        import torch
    except ImportError:   # no torch: nothing can be a module
        return False
    return isinstance(model, torch.nn.Module) or callable(model)


# --inputs' element types (``8x128:int64``): token ids for an embedding, masks
INPUT_DTYPES = {"float32": "float32", "float": "float32", "int64": "int64", "long": "int64",
                "int32": "int32", "int": "int64", "bool": "bool"}


class Shape(tuple):
    """An input's shape (a tuple of ints) with its element type ``dtype`` (a torch dtype's
    name, ``float32`` unless given): what :func:`parse_shapes` makes."""

    def __new__(cls, dims, dtype: str = "float32"):
        out = super().__new__(cls, dims)
        out.dtype = dtype
        return out


def parse_shapes(text: str) -> list[Shape]:
    """``"8x3x224x224,8x10:int64"`` as ``[(8, 3, 224, 224), (8, 10)]`` (:class:`Shape`, the
    second of int64 elements: an embedding's token ids); a ValueError naming the bad part
    otherwise."""
    parts = [q.strip() for q in str(text).split(",")]
    if len(parts) > 1 and all(re.fullmatch(r"\d+", q) for q in parts):
        # "32,3,224,224" is almost surely one shape written with commas
        raise ValueError(f"--inputs {text!r} reads as {len(parts)} one-dimensional inputs: a "
                         f"shape's dimensions are joined by x ({'x'.join(parts)}); for "
                         f"one-dimensional inputs give their type ({parts[0]}:float32,...)")
    shapes = []
    for part in str(text).split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+(?:x\d+)*)(?::(\w+))?", part)
        if m is None:
            raise ValueError(f"--inputs takes tensor shapes like 8x3x224x224 (several separated "
                             f"by commas; 8x128:int64 for token ids), not {part!r}")
        if m[2] is not None and m[2] not in INPUT_DTYPES:
            raise ValueError(f"input {part!r}: unknown element type {m[2]!r}; use one of "
                             f"{', '.join(INPUT_DTYPES)}")
        dims = tuple(int(v) for v in m[1].split("x"))
        if min(dims) < 1:
            raise ValueError(f"input shape {part!r} has a zero dimension")
        shapes.append(Shape(dims, INPUT_DTYPES[m[2] or "float32"]))
    return shapes


def _input_tensor(shape):
    """A tensor of ``shape`` (a tuple of ints, or a :class:`Shape` with its element type):
    random FP32 values, zeros of an integer or boolean type (ids, masks)."""
    import torch

    dims, dtype = tuple(int(d) for d in shape), getattr(shape, "dtype", "float32")
    if dtype == "float32":
        return torch.randn(*dims)
    return torch.zeros(dims, dtype=getattr(torch, dtype))


def _load(spec) -> tuple[object, object]:
    """``(module or factory, the file's get_inputs or None)`` for a module spec."""
    if not isinstance(spec, (str, Path)):
        return spec, None
    match = SPEC.fullmatch(str(spec))
    if match is None:
        raise ProblemError(f"{spec}: a module is given as FILE.py (Model, get_inputs(), "
                           "get_init_inputs()) or FILE.py:NAME (a module class or factory)")
    path, name = match["path"], match["name"]
    if not Path(path).is_file():
        raise ProblemError(f"{path}: no such module file (give FILE.py with Model, get_inputs() "
                           "and get_init_inputs(), or FILE.py:NAME with --inputs)")
    if not name:
        ns = load_problem(path)
        return (lambda: ns["Model"](*ns["get_init_inputs"]())), ns["get_inputs"]
    ns = run_file(path)
    if not callable(ns.get(name)):
        raise ProblemError(f"{path}: defines no module class or factory named {name!r}")
    return ns[name], (ns["get_inputs"] if callable(ns.get("get_inputs")) else None)


def _is_shape_text(v) -> bool:
    """Whether ``v`` is one shape written as on the command line (``8x3x224x224``,
    ``8x128:int64``)."""
    return isinstance(v, str) and re.fullmatch(r"\d+(?:x\d+)*(?::\w+)?", v.strip()) is not None


def _is_shape(v, alone: bool = False) -> bool:
    """Whether ``v`` is one tensor shape: a tuple (or, inside the inputs' list, a list) of
    integers; a bare list of integers is the module's integer arguments, not a shape."""
    kinds = tuple if alone else (tuple, list)
    return isinstance(v, kinds) and len(v) > 0 and all(
        isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in v)


def meta_copy(module):
    """``module`` with every parameter, buffer and tensor attribute on the meta device: itself
    when they already are (a factory's module built on meta), else a copy whose tensors are
    meta twins of the same shapes (put in place through the copy's memo: no weight is ever
    copied), the caller's own module (its weights, device, train/eval flag) left as it is.
    A lazy module's uninitialised parameters are copied as they are (they hold no data)."""
    import torch

    tensors = [*module.parameters(), *module.buffers()]
    for m in module.modules():   # plain tensors held as attributes (masks, tables)
        tensors += [v for v in vars(m).values() if isinstance(v, torch.Tensor)]
    if all(t.is_meta for t in tensors):
        return module
    memo = {}
    for t in tensors:
        if id(t) in memo or torch.nn.parameter.is_lazy(t):
            continue
        twin = torch.empty_like(t, device="meta")
        memo[id(t)] = torch.nn.Parameter(twin, requires_grad=t.requires_grad) \
            if isinstance(t, torch.nn.Parameter) else twin
    return copy.deepcopy(module, memo)


def module_trace_of(model, inputs=None, eval_mode: bool = True, mode: str = "inf"
                    ) -> pd.DataFrame:
    """The kernel rows of one step of ``model`` (see :func:`is_module_spec`; ``mode`` ``inf``,
    an inference forward, or ``train``, forward and backward:
    :func:`nslib.model.module_trace.trace_module`) on
    ``inputs``: a list of tensors or shapes (tuples of ints, made FP32 tensors; or written as
    on the command line, ``"8x128:int64"``) and other arguments, or one tensor, shape tuple
    or shape string (``"8x3x224x224,8x10"``: several) alone; ``None`` takes the file's
    ``get_inputs()``. Everything is built on the meta device (no weights, no memory);
    a caller's own module is copied first (its weights, device and train/eval flag stay as
    they are). :class:`nslib.model.module_trace.ProblemError` (a ValueError) naming what
    failed."""
    import torch

    target, get_inputs = _load(model)
    label = Path(str(model)).name if isinstance(model, (str, Path)) \
        else getattr(model, "__name__", type(model).__name__)

    def build():
        module = target if isinstance(target, torch.nn.Module) else target()
        if not isinstance(module, torch.nn.Module):
            raise ProblemError(f"{label}: the factory returned {type(module).__name__}, not "
                               "an nn.Module")
        return meta_copy(module)

    def make_inputs():
        if inputs is not None:
            if isinstance(inputs, str):   # "8x3x224x224,8x10:int64", as on the command line
                return [_input_tensor(v) for v in parse_shapes(inputs)]
            alone = _is_shape(inputs, alone=True) or isinstance(inputs, torch.Tensor)
            return [_input_tensor(parse_shapes(v)[0]) if _is_shape_text(v)
                    else _input_tensor(v) if _is_shape(v) else v
                    for v in ([inputs] if alone else inputs)]
        if get_inputs is None:
            raise ProblemError(f"{label}: give the inputs (shapes such as [(8, 3, 224, 224)], "
                               "or --inputs 8x3x224x224)")
        return get_inputs()

    return meta_trace(build, make_inputs, label, eval_mode, mode)


def trace_notes(trace: pd.DataFrame) -> list[str]:
    """Warnings a module's trace carries: branches on tensor values taken as True, tensors
    in a floating format other than FP32 and CUDA autocast (priced as FP32 kernels)."""
    notes = []
    reads = int(trace.attrs.get("bool_reads", 0))
    if reads:
        notes.append(f"the module branched on {reads} tensor value(s) (e.g. `if x.sum() > 0`); "
                     "a meta-device trace has no values, so each was taken as True and the "
                     "forecast follows that branch")
    other = trace.attrs.get("other_floats") or []
    if other:
        notes.append(f"the module holds {', '.join(other)} tensors: --module prices FP32 "
                     "kernels, so this is the FP32 step's forecast (a 16-bit model: --model "
                     "CONFIG --dtype bf16)")
    if trace.attrs.get("autocast"):
        notes.append("the module runs under CUDA autocast (mixed precision), which a trace "
                     "without a GPU cannot enter: this is the FP32 step's forecast, as if "
                     "autocast were off")
    return notes


def priced_frame(trace: pd.DataFrame, spec, pred, launch_us: float | None = LAUNCH_US,
                 settings: Settings | None = None, tf32: bool = False, tensor="nslib",
                 host_floor_ms: float | HostFloor | None = None
                 ) -> tuple[pd.DataFrame, list[str]]:
    """(the kernel frame of a module's ``trace`` on ``spec`` with ``pred_ms``, each operator
    call dispatched once (:func:`nslib.model.stream.step_ms`), warnings).

    ``tf32``: the convolutions may also run in TF32 (:func:`nslib.model.tf32.tf32_rows`),
    each kernel at the faster of its FP32 and its TF32 price (the 16-bit GEMM predictor
    ``tensor``, :func:`nslib.model.tf32.tf32_gpu_ms`; the ``tf32`` column marks the kernels
    whose TF32 price wins). Which of a 3x3 convolution's forms runs is read off the rooflines
    (:func:`nslib.model.inputs.one_algorithm`), where TF32 can favour the implicit GEMM that
    the predictors price above Winograd: the step is priced both ways and the faster kept, so
    allowing TF32 never makes a step slower. ``host_floor_ms``: another host's (ms, or a
    :class:`nslib.model.stream.HostFloor`), as :func:`nslib.model.stream.step_ms` takes it."""
    s = settings_of(settings)
    frame = kernel_frame(trace, spec)
    frame["pred_ms"] = step_ms(pred, frame, launch_us, s.data, per_call=True,
                               host_floor_ms=host_floor_ms)
    if not tf32:
        return frame, []
    if tf32_peak(spec) is None:
        return frame, [f"tf32 asked for, but {spec.name}'s datasheet gives no tensor-core peak "
                       "(Bf16FLOPs): its convolutions are priced in FP32"]
    alt = kernel_frame(trace, spec, tf32=True)
    tensor_ms, notes = tf32_gpu_ms(alt, spec, tensor, s)
    if tensor_ms is None:
        return frame, notes
    raw, fp32_ms, _ = stream_terms(pred, alt, launch_us, s.data, host_floor_ms=host_floor_ms)
    alt["tf32"] = faster_of(fp32_ms, tensor_ms, pred, launch_us)[1]
    alt["pred_ms"] = step_ms(pred, alt, launch_us, s.data, per_call=True,
                             host_floor_ms=host_floor_ms, other_gpu_ms=tensor_ms, raw=raw)
    return (alt if alt["pred_ms"].sum() <= frame["pred_ms"].sum() else frame), notes


def predict_module(gpu, model, inputs=None, predictor="nslib", *,
                   launch_us: float | None = LAUNCH_US, eval_mode: bool = True,
                   mode: str = "inf", settings: Settings | None = None,
                   tensor_predictor=None, tf32: bool = False) -> tuple[pd.DataFrame, dict]:
    """One step of a module (see :func:`module_trace_of`: ``mode`` ``inf``, an inference
    forward, or ``train``, forward and backward) on ``gpu``:
    ``(kernels frame with pred_ms, summary)``. The summary is
    :func:`nslib.model.stream.step_summary`'s (``e2e_ms``, ``fw_ms``, ``per_class_ms``,
    ``n_kernels``) plus ``unpriced`` (aten op -> calls without a kernel mapping) and
    ``unpriced_share`` (their share of the traced calls) and ``tf32_kernels`` (with ``tf32``,
    the convolution kernels that run in TF32: on a datasheet with a tensor-core peak, those whose
    price by the 16-bit GEMM predictor ``tensor_predictor`` (by default the one of
    ``predictor``'s name, else nslib's: :func:`nslib.model.tf32.tf32_gpu_ms`) beats their
    FP32 price; the frame's ``tf32`` column marks them). A ValueError when more than
    :data:`MAX_UNPRICED_SHARE` of the calls are unpriced, or the module cannot be traced."""
    s = settings_of(settings)
    spec = resolve_gpu(gpu, s.data)
    trace = module_trace_of(model, inputs, eval_mode, mode)
    unknown, share = unpriced_calls(trace)
    if not len(trace) and not unknown:
        raise ValueError("cannot price this module: its step launches no kernel (no tensor "
                         "work a GPU runs, e.g. a forward that returns its input): nothing to "
                         "forecast")
    if share > MAX_UNPRICED_SHARE or not len(trace):
        listed = ", ".join(f"{k} x{v}" for k, v in sorted(unknown.items())) or "none"
        raise ValueError(f"cannot price this module: {share:.0%} of its operator calls have no "
                         f"kernel mapping ({listed}); nslib prices GEMMs, convolutions, "
                         "recurrent layers, norms, pooling and elementwise kernels")
    pred = get_predictor(predictor, s.data, s.quick)
    if getattr(pred, "plain_sum", False):   # the method's own aggregation
        launch_us = None
    frame, notes = priced_frame(trace, spec, pred, launch_us, s, tf32=tf32,
                                tensor=tensor_for(predictor) if tensor_predictor is None
                                else tensor_predictor)
    summary = step_summary(frame)
    summary["tf32_kernels"] = int(frame["tf32"].sum())
    own = list(notes)
    if unknown:
        listed = ", ".join(f"{k} x{v}" for k, v in sorted(unknown.items()))
        own.append(f"not priced, left out of the time ({share:.0%} of the operator calls): "
                   f"{listed}")
    own += trace_notes(trace)
    # the module's own notes, apart from the datasheet ranges' (a front end words them apart)
    summary["module_notes"] = own
    summary["warnings"] = [*summary.get("warnings", []), *own]
    return frame, {**summary, "launch_us": launch_us, "unpriced": unknown,
                   "unpriced_share": share, **power_bound(pred, frame)}
