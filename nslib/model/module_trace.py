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

from nslib.model.blocks import install_hooks
from nslib.model.recorder import Tracer, make_modes

__all__ = ["trace_module", "load_problem", "problem_trace", "ProblemError"]


class ProblemError(ValueError):
    """A problem file or module that cannot be built or traced on the meta device."""


def trace_module(model, inputs, mode: str = "inf") -> pd.DataFrame:
    """The kernel rows (:data:`nslib.model.recorder.TRACE_COLUMNS` plus the memory columns) of
    one forward of ``model`` on ``inputs`` (a list of meta tensors or other arguments), FP32,
    in eval mode under ``no_grad`` (``mode="inf"``). Unknown aten ops give no row and one
    warning listing them, as in :func:`nslib.model.trace.trace`."""
    import torch

    if mode != "inf":
        raise ValueError(f"trace_module traces inference (mode='inf') only, got {mode!r}")
    model.train(False)
    tracer = Tracer(model, block_of={})
    recorder, calls = make_modes(tracer, redirect_dropout=False)
    tracer.mark([p for p in model.parameters()], "param")
    tracer.mark(list(model.buffers()), "param")
    tracer.mark([t for t in inputs if isinstance(t, torch.Tensor)], "held")
    handles = install_hooks(model, tracer)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.no_grad(), recorder, calls:
                out = model(*inputs)
        tracer.mark([t for t in (out if isinstance(out, (list, tuple)) else [out])
                     if isinstance(t, torch.Tensor)], "held")
    finally:
        tracer.closed = True
        for h in handles:
            h.remove()
    frame = tracer.frame()
    frame.attrs["unknown_ops"] = dict(tracer.unknown)
    return frame


def load_problem(path: str | Path) -> dict:
    """The namespace of a KernelBench-style problem file: its ``Model`` class and its
    ``get_inputs`` / ``get_init_inputs`` functions. Raises :class:`ProblemError` naming the file
    when it cannot be run or lacks one of the three."""
    path = Path(path)
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ProblemError(f"{path}: cannot read the problem file ({e})") from None
    ns: dict = {"__name__": f"nslib_problem_{hashlib.sha1(source.encode()).hexdigest()[:12]}",
                "__file__": str(path)}
    try:
        exec(compile(source, str(path), "exec"), ns)  # noqa: S102 - the user's own problem file
    except Exception as e:  # a problem file can raise anything at import
        raise ProblemError(f"{path}: running the file failed ({type(e).__name__}: "
                           f"{str(e)[:200]})") from None
    missing = [k for k in ("Model", "get_inputs", "get_init_inputs") if not callable(ns.get(k))]
    if missing:
        raise ProblemError(f"{path}: a problem file defines Model, get_inputs() and "
                           f"get_init_inputs(); missing {', '.join(missing)}")
    return ns


def problem_trace(path: str | Path) -> pd.DataFrame:
    """:func:`trace_module` of a problem file's ``Model(*get_init_inputs())`` on
    ``get_inputs()``, all built under ``torch.device("meta")``. :class:`ProblemError` when the
    problem needs real data (a data-dependent shape, a CPU-only op) or fails to build."""
    import torch

    ns = load_problem(path)
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            init = ns["get_init_inputs"]()
            model = ns["Model"](*init)
            inputs = [t.to("meta") if isinstance(t, torch.Tensor) else t
                      for t in ns["get_inputs"]()]
            # tensors the forward makes without a device stay on meta too
            return trace_module(model, inputs)
    except ProblemError:
        raise
    except Exception as e:  # the module's own code raises anything on meta tensors
        raise ProblemError(f"{Path(path).name}: cannot trace on the meta device "
                           f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
                           "; a module with data-dependent shapes or values needs real inputs"
                           ) from None
