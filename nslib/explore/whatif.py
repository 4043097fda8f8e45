"""What-if questions as plain functions: one model configuration predicted on several GPUs.

:func:`scenario` predicts a step on each GPU and returns a per-GPU summary, a per-class
breakdown, the largest kernels with their roofline placement (:func:`largest_kernels`), the
peak memory (:mod:`nslib.explore.memory`) and warnings when the question leaves what the
predictors were trained on (:mod:`nslib.explore.ranges`, :func:`dominance_warnings`).

Traces are cached by :mod:`nslib.model.inputs`; named predictors and each GPU's predicted step
are kept in memory (``functools.lru_cache``), so a second question about the same model and
sizes answers in well under a second.
"""
from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pandas as pd

from nslib.data.gpus import GPU
from nslib.data.settings import Settings, settings_of
from nslib.data.units import GIGA, S_PER_MS
from nslib.explore.memory import memory_table, memory_warnings
from nslib.explore.ranges import (clear_range_caches, data_key, explorer_ranges, kernel_warnings,
                                  kernel_waves, range_summary)
from nslib.kernels import sizes
from nslib.kernels.sizes import MODEL_CLASSES
from nslib.model.config import load_model_config
from nslib.model.inputs import get_predictor, resolve_gpu
from nslib.model.predict import predict_model, with_interval
from nslib.model.step import Step, step_of
from nslib.model.stream import power_note
from nslib.predictors.gpu_range import DatasheetRangeWarning, out_of_range, tensor_ranges

# how many of the largest kernels a scenario lists per GPU
TOP_KERNELS = 10
# per-GPU predicted steps kept in memory (each a kernel frame of one traced model)
STEPS_KEPT = 256
# datasheet numbers compared by dominance_warnings, and how much slower (relative) the
# dominating GPU may be predicted before it is called out
DOMINANCE_COLS = ("peak_gflops", "mem_bw", "mem_gb", "l2_mb")
DOMINANCE_TOLERANCE = 0.01


# --------------------------------------------------------------------------------------------
# in-process memos: named predictors and predicted steps
# --------------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _named_predictor(name: str, quick: bool, root: str):
    return get_predictor(name, root, quick)


def _predictor(predictor, data, quick: bool):
    """``(fitted predictor, memo key)``: a name is trained or loaded once per data root."""
    if not isinstance(predictor, str):
        return predictor, id(predictor)
    key = (predictor, bool(quick), data_key(data))
    return _named_predictor(*key), key


@dataclass(frozen=True)
class _OnGpu:
    """One GPU's step to predict: equal, and memoised, by the fields compared."""
    pred_key: object
    spec: GPU
    config: str               # the model config as sorted JSON
    step: Step
    model: object = field(compare=False)
    predictor: object = field(compare=False)
    data: object = field(compare=False)

    @property
    def dtype(self) -> str:
        return self.step.dtype


@lru_cache(maxsize=STEPS_KEPT)
def _predicted(step: _OnGpu) -> tuple[pd.DataFrame, dict, bool | str | None]:
    """``(kernel frame, summary, waves)``; waves: True (frame has them), an error message, or
    None (16 bits: FP32 tiles and ranges say nothing of 16-bit kernels)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DatasheetRangeWarning)  # one line in the scenario
        frame, summ = predict_model(step.spec, step.model, step.step, step.predictor,
                                    settings=Settings(data=step.data))
    if step.dtype != "fp32":
        return frame, summ, None
    try:
        return kernel_waves(frame, step.data, step.predictor), summ, True
    except (ValueError, KeyError) as e:  # waves are for warnings and placement only
        return frame, summ, f"{e}"


def clear_caches() -> None:
    """Forget the in-memory predictors, ranges, tile lookup and per-GPU predictions."""
    _named_predictor.cache_clear()
    _predicted.cache_clear()
    clear_range_caches()


# --------------------------------------------------------------------------------------------
# parts of a scenario
# --------------------------------------------------------------------------------------------

def _labels(specs: list[GPU]) -> list[str]:
    names = [g.name for g in specs]
    labels = []
    for g in specs:
        lab = g.name if names.count(g.name) == 1 else f"{g.name} [{g.key}]"
        while lab in labels:
            lab += "'"
        labels.append(lab)
    return labels


def _shape(r) -> str:
    dims = ("B", "M", "N", "K") if r["cls"] in sizes.GEMM_CLASSES else ("B", "H")
    return "x".join(str(int(r[d])) if np.isfinite(r[d]) else "?" for d in dims)


def largest_kernels(frame: pd.DataFrame, label: str, spec: GPU, e2e_ms: float,
                    top: int = TOP_KERNELS) -> pd.DataFrame:
    """The ``top`` kernels by total predicted time, identical launches grouped.

    A transformer launches the same kernel once per layer, so identical kernels (phase, class,
    op, dims) are one row with their ``count``, ``pred_ms`` (one launch) and ``total_ms``.
    For the roofline placement: ``intensity`` (FLOP/byte, the trace's exact counts),
    ``achieved_gflops`` (FLOPs / predicted time) and ``roofline_gflops``
    (``min(peak, intensity x bandwidth)``); memory ops have no FLOPs (intensity 0).
    """
    keys = ["phase", "kernel_class", "cls", "op", "B", "M", "N", "K", "H"]
    df = frame.copy()
    for k in ("B", "M", "N", "K", "H"):
        df[k] = df[k].astype(float).fillna(-1.0)  # NaN dims group together
    agg = {"count": ("pred_ms", "size"), "pred_ms": ("pred_ms", "mean"),
           "total_ms": ("pred_ms", "sum"),
           "flops": ("trace_flops" if "trace_flops" in df else "flops", "first"),
           "bytes": ("trace_bytes" if "trace_bytes" in df else "bytes", "first")}
    if "waves" in df:
        agg["waves"] = ("waves", "first")
    g = df.groupby(keys, sort=False, dropna=False).agg(**agg).reset_index()
    for k in ("B", "M", "N", "K", "H"):
        g[k] = g[k].where(g[k] >= 0)
    g = g.sort_values("total_ms", ascending=False, kind="stable").head(top).reset_index(drop=True)
    g.insert(0, "gpu", label)
    g["shape"] = [_shape(r) for _, r in g.iterrows()]
    flops, nbytes = g["flops"].to_numpy(float), g["bytes"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        g["intensity"] = np.where(nbytes > 0, flops / nbytes, np.nan)
        g["achieved_gflops"] = flops / (g["pred_ms"].to_numpy(float) * S_PER_MS) / GIGA
    g["roofline_gflops"] = np.minimum(spec.peak_gflops, g["intensity"] * spec.mem_bw)
    g["share"] = g["total_ms"] / e2e_ms if e2e_ms > 0 else np.nan
    g["peak_gflops"], g["mem_bw"] = spec.peak_gflops, spec.mem_bw
    return g.drop(columns=["cls"])


def dominance_warnings(specs: list[GPU], labels: list[str], e2e_ms: list[float],
                       tol: float = DOMINANCE_TOLERANCE) -> list[str]:
    """Lines for GPUs predicted slower than a GPU they beat on every datasheet number.

    With the same SM count, a GPU with at least the FP32 peak, bandwidth, memory and L2 of
    another can never be slower in reality; a forecast that says so (by more than ``tol``) is
    the predictor extrapolating non-physically, and the explorer says so.
    """
    out = []
    for i, a in enumerate(specs):
        for j, b in enumerate(specs):
            if i == j or a.num_sm != b.num_sm:
                continue
            ca, cb = a.columns(), b.columns()
            if not all(ca[c] >= cb[c] for c in DOMINANCE_COLS) or ca == cb:
                continue
            if e2e_ms[i] > e2e_ms[j] * (1 + tol):
                out.append(f"{labels[i]} has at least the datasheet of {labels[j]} in every "
                           f"number, yet is predicted slower ({e2e_ms[i]:,.1f} ms vs "
                           f"{e2e_ms[j]:,.1f} ms): the predictor extrapolates non-physically "
                           f"here; compare the per-class breakdown to see which kernels.")
    return out


def _checked_gpus(gpus) -> list:
    """``gpus`` as a non-empty list; ValueError for no GPU (the step checks its own sizes)."""
    if isinstance(gpus, (str, GPU)) or not hasattr(gpus, "__iter__"):
        gpus = [gpus]
    gpus = list(gpus)
    if not gpus:
        raise ValueError("no GPU selected: pass at least one GPU")
    return gpus


def _on_gpu(step: _OnGpu, label: str, ranges: dict, top: int) -> dict:
    """One GPU's part of a scenario: its summary row, per-class ms, largest kernels, frame,
    datasheet figures out of range and a tiles-and-waves warning (or None)."""
    frame, summ, has_waves = _predicted(step)
    frame, spec = frame.copy(), step.spec
    name = step.pred_key[0] if isinstance(step.pred_key, tuple) else None
    if isinstance(name, str) and step.dtype == "fp32":   # the cached calibration's interval
        summ = with_interval(summ, name, step.data, bool(step.pred_key[1]))
    lo, hi = summ.get("interval_ms", (np.nan, np.nan))
    warning = None
    if has_waves is not True and has_waves is not None:
        warning = f"{label}: could not compute tiles and waves of the kernels ({has_waves})."
    power = f"{label}: {power_note(summ['power_bound'])}" if "power_bound" in summ else None
    issues = out_of_range(spec, ranges=ranges["datasheet"] if step.dtype == "fp32"
                          else tensor_ranges())
    row = {"gpu": label, "e2e_ms": summ["e2e_ms"], "fw_ms": summ["fw_ms"],
           "bw_ms": summ["bw_ms"], "interval_lo_ms": lo, "interval_hi_ms": hi,
           "n_kernels": summ["n_kernels"],
           **{c: v for c, v in spec.columns().items() if c != "gpu"},
           "in_training_range": not issues}
    return {"row": row, "per_class": {"gpu": label, **summ["per_class_ms"]},
            "top": largest_kernels(frame, label, spec, summ["e2e_ms"], top), "frame": frame,
            "featured": has_waves is True, "issues": issues, "warning": warning,
            "power": power}


# --------------------------------------------------------------------------------------------
# scenario
# --------------------------------------------------------------------------------------------

def _summary(parts: list[dict], mem: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The per-GPU summary (with its memory columns) and the per-class ms, classes ordered."""
    summary = pd.DataFrame([p["row"] for p in parts])
    summary["memory_gb"] = mem["total"].reindex(summary["gpu"]).to_numpy()
    summary["fits"] = mem["fits"].reindex(summary["gpu"]).to_numpy()
    pc = pd.DataFrame([p["per_class"] for p in parts]).set_index("gpu").fillna(0.0)
    order = [c for c in MODEL_CLASSES if c in pc] + [c for c in pc if c not in MODEL_CLASSES]
    return summary, pc[order]


def _params(model, step: Step, predictor, pred, quick) -> dict:
    """What a scenario asked, as shown in its title."""
    return {"model": model if not isinstance(model, dict) else model.get("model_type", "config"),
            "batch": step.batch, "seq": step.seq, "mode": step.mode,
            "predictor": predictor if isinstance(predictor, str)
            else getattr(pred, "name", type(pred).__name__), "quick": quick,
            "dtype": step.dtype}


def scenario(gpus, model, step: Step, predictor="nslib", *, top: int = TOP_KERNELS,
             settings: Settings | None = None) -> dict:
    """Predict one model step (a :class:`nslib.model.step.Step`) on several GPUs.

    ``gpus``: a list of names/aliases, spec JSON paths or :class:`GPU` objects (hypothetical
    ones from :func:`nslib.explore.gpus.hypothetical_gpu`); ``model``: a config name, a JSON
    path or a config dict; ``predictor``: a name (trained on first use and kept in memory) or a
    fitted predictor; ``top``: how many of the largest kernels per GPU; ``settings``: the data
    and training profile. ``step.dtype``: ``fp32`` (the paper's setting) or ``bf16``/``fp16``
    (the model traced in 16 bits, its GEMMs and attention priced by the 16-bit tensor-core
    predictors; every GPU needs ``Bf16FLOPs`` in its datasheet). The FP32 kernel range checks
    do not apply in 16 bits.

    Returns a dict: ``summary`` (one row per GPU: gpu, e2e_ms, fw_ms, bw_ms, n_kernels, the
    datasheet numbers, ``in_training_range``, ``memory_gb`` (GiB), ``fits``), ``per_class`` (ms per
    kernel class, one row per GPU), ``top_kernels`` (:func:`largest_kernels` of each GPU),
    ``warnings`` (one line for the GPUs outside the training range, then kernels outside it,
    :func:`dominance_warnings`, GPUs the step does not fit on, and GPUs whose step the board's
    power bound sets in part: :func:`nslib.model.stream.power_note`), ``range_details`` (one line
    per datasheet figure out of range, folded under that line in the explorer), ``frames``
    (``{gpu: predicted kernel frame}``), ``gpus`` (the :class:`GPU` objects), ``memory``
    (:func:`nslib.explore.memory.memory_table`), ``params`` and ``seconds``. Raises ValueError,
    KeyError or FileNotFoundError for a bad mode, GPU, model or size (the explorer shows them).
    """
    t0 = time.perf_counter()
    step, st = step_of(step), settings_of(settings)
    data, quick = st.data, st.quick
    gpus = _checked_gpus(gpus)
    specs = [resolve_gpu(g, data) for g in gpus]
    labels = _labels(specs)
    pred, pred_key = _predictor(predictor, data, quick)
    ranges = explorer_ranges(data)
    config = json.dumps(load_model_config(model, data), sort_keys=True, default=str)
    parts = [_on_gpu(_OnGpu(pred_key, spec, config, step, model, pred, data), label, ranges,
                     top)
             for spec, label in zip(specs, labels)]

    outside = {label: p["issues"] for label, p in zip(labels, parts) if p["issues"]}
    featured = {label: p["frame"] for label, p in zip(labels, parts) if p["featured"]}
    line = range_summary(outside)
    warns = ([line] if line else []) + [p["warning"] for p in parts if p["warning"]]
    warns += kernel_warnings(featured, ranges)
    warns += dominance_warnings(specs, labels, [p["row"]["e2e_ms"] for p in parts])
    mem = memory_table(specs, labels, model, step, settings=st)
    warns += memory_warnings(mem)
    warns += [p["power"] for p in parts if p["power"]]
    summary, per_class = _summary(parts, mem)
    return {"summary": summary, "per_class": per_class,
            "top_kernels": pd.concat([p["top"] for p in parts], ignore_index=True),
            "warnings": warns, "frames": {label: p["frame"] for label, p in zip(labels, parts)},
            "range_details": [o.message() for items in outside.values() for o in items],
            "gpus": specs, "memory": mem,
            "params": _params(model, step, predictor, pred, quick),
            "seconds": time.perf_counter() - t0}


__all__ = ["TOP_KERNELS", "scenario", "largest_kernels", "dominance_warnings", "clear_caches"]
