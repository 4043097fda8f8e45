"""KernelBench's level-1 problems as an FP32 kernel test set measured by another harness.

Each problem file is traced on the meta device (:func:`nslib.model.module_trace.problem_trace`):
what it computes comes from its ``forward``, its shapes from its own ``get_inputs()``. A
problem that launches exactly one kernel of an nslib class (not a convolution, no op without a
kernel mapping) becomes one kernel row on the datasheet of the GPU it ran on; the others are
skipped with the reason. Problems are grouped by shape family: ``matrix-vector`` (a GEMM with
a one-row or one-column output, :func:`nslib.kernels.sizes.gemv_rows`), ``long reduction`` (a GEMM whose reduction
is at least :data:`LONG_REDUCTION` times its larger output dimension), other GEMMs, and the
vector classes.

The harness: KernelBench times one Python call of the model between CUDA events, so every
time holds a fixed per-call cost ``h`` of the campaign besides the kernel. No kernel runs
faster than its roofline, so ``h <= measured - roofline`` for every problem of the campaign;
:func:`harness_ms` takes that bound (at most :data:`MAX_HARNESS_MS`: tens of us is what an
eager call costs, and a campaign of only large problems would bound it loosely), and every
predictor's kernel GPU time (its latency less its own harness's dispatch floor) is compared as
``h + GPU time``.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from nslib.data import kernelbench as kb
from nslib.data.settings import Settings, settings_of
from nslib.evaluation.kernel_level import predict_rows
from nslib.evaluation.metrics import gpu_table, order_classes
from nslib.kernels import clock, sizes
from nslib.model.aten import NORM
from nslib.model.module_trace import ProblemError, problem_trace
from nslib.model.stream import stream_terms

LONG_REDUCTION = 16     # reduction length over the larger output dimension
MAX_HARNESS_MS = 0.05   # the per-call cost bound is taken at most this (50 us)
FAMILIES = ("matrix-vector", "long reduction")
MEAN = "mean over GPUs"

_TRACES: dict[str, object] = {}


def trace_of(path: str):
    """The trace of a problem file (memoised on its text: campaigns share most files), or the
    :class:`ProblemError` it raised."""
    key = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    if key not in _TRACES:
        try:
            _TRACES[key] = problem_trace(path)
        except ProblemError as e:
            _TRACES[key] = e
    return _TRACES[key]


def _one_kernel(trace) -> tuple[dict | None, str]:
    """(the kernel row of a one-kernel problem, "") or (None, why it is skipped)."""
    if isinstance(trace, ProblemError):
        return None, "cannot trace"
    if trace.attrs.get("unknown_ops"):
        return None, "op without a kernel class"
    if len(trace) and trace["aten"].str.contains("convolution").any():
        return None, "convolution"  # one operator, but an implicit GEMM or a Winograd's three
    if len(trace) != 1:
        return None, f"{len(trace)} kernels" if len(trace) else "no kernel"
    row = trace.iloc[0]
    if row["aten"].split(".")[1] in NORM:
        return None, ("batch or group norm (an elementwise or layer-norm pass in models, not a "
                      "measured class)")
    if row["cls"] not in sizes.CLASSES:
        return None, f"class {row['cls']}"
    return {c: row[c] for c in ("cls", "op") + sizes.DIM_COLS}, ""


def family(frame: pd.DataFrame) -> np.ndarray:
    """The shape family of each kernel row (module docstring)."""
    M, N, K = (frame[c].to_numpy(float) for c in ("M", "N", "K"))
    gemm = frame["cls"].isin(sizes.GEMM_CLASSES).to_numpy()
    vec = sizes.gemv_rows(frame)
    long = gemm & ~vec & (N >= LONG_REDUCTION * np.maximum(M, K))
    return np.where(vec, "matrix-vector", np.where(long, "long reduction",
                    np.where(gemm, "GEMM", frame["cls"].to_numpy())))


def problem_rows(root=None, level: int = 1, progress: bool = True) -> tuple[pd.DataFrame,
                                                                             pd.DataFrame]:
    """(kernel rows of the priced problems, the skipped problems with ``reason``).

    Kernel rows carry the dims, the GPU columns of the datasheet whose ``Device`` is the
    problem's ``hardware``, ``latency_ms`` (the measured mean), ``campaign``, ``problem``,
    ``gpu`` and ``family``."""
    times = kb.timings(root, level)
    sheets = kb.datasheets(root)
    rows, skipped = [], []
    for t in tqdm(times.itertuples(index=False), total=len(times), disable=not progress,
                  desc=f"KernelBench level {level}"):
        base = {"campaign": t.campaign, "problem": t.problem, "hardware": t.hardware}
        gpu = sheets.get(t.hardware)
        if gpu is None:
            skipped.append({**base, "reason": f"no datasheet with Device {t.hardware!r}"})
            continue
        if not isinstance(t.path, str):
            skipped.append({**base, "reason": "problem file missing"})
            continue
        row, why = _one_kernel(trace_of(t.path))
        if row is None:
            skipped.append({**base, "reason": why})
            continue
        rows.append({**base, **row, **clock.frame_columns(gpu),
                     "latency_ms": t.latency_ms})
    frame = pd.DataFrame(rows)
    if len(frame):
        frame["family"] = family(frame)
    return frame, pd.DataFrame(skipped, columns=["campaign", "problem", "hardware", "reason"])


def _slack_ms(frame: pd.DataFrame) -> pd.Series:
    """Per kernel row: ``measured - roofline`` (ms), what the harness and host took at most."""
    return pd.Series(frame["latency_ms"].to_numpy(float) - sizes.roofline_ms(frame),
                     index=frame.index)


def harness_ms(frame: pd.DataFrame) -> pd.Series:
    """Per campaign, the fixed per-call cost (ms): ``min(measured - roofline)`` over its
    priced problems, within ``[0, MAX_HARNESS_MS]`` (module docstring)."""
    if not len(frame):
        return pd.Series(dtype=float)
    return _slack_ms(frame).groupby(frame["campaign"]).min().clip(0.0, MAX_HARNESS_MS)


def class_harness_ms(frame: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per campaign, ``{kernel class: ms}``: the least ``measured - roofline`` over its priced
    problems of that class (at least 0), which bounds what one operator call of the class costs
    the campaign's host, as :func:`harness_ms` bounds the cheapest call."""
    if not len(frame):
        return {}
    tab = _slack_ms(frame).clip(lower=0.0).groupby([frame["campaign"], frame["cls"]]).min()
    return {c: tab.loc[c].to_dict() for c in tab.index.get_level_values(0).unique()}


def predict(pred, frame: pd.DataFrame, data=None) -> np.ndarray:
    """Predicted per-call time (ms) of each row: the campaign's :func:`harness_ms` plus the
    kernel's GPU time as ``pred`` (a fitted predictor) prices it on a GPU it never saw (tiles
    looked up). The GPU time is the predictor's microbenchmark latency less the dispatch floor
    its own training harness put in it (:func:`nslib.model.stream.stream_terms`): the two
    harnesses' fixed costs differ, the kernel's GPU time does not."""
    raw = predict_rows(pred, frame, np.ones(len(frame), bool))
    gpu_ms = stream_terms(pred, frame, data=data, raw=raw, plain_sum=False)[1]
    return gpu_ms + frame["campaign"].map(harness_ms(frame)).to_numpy(float)


def error_table(frame: pd.DataFrame, pred_ms) -> pd.DataFrame:
    """MAPE (%) per class (rows; then the shape families) and GPU (columns), with the mean over
    the GPUs as the last column."""
    pred_ms = np.asarray(pred_ms, float)
    by_cls = gpu_table(frame, pred_ms)
    fam = frame["family"].isin(FAMILIES).to_numpy()
    by_fam = gpu_table(frame[fam].assign(cls=frame.loc[fam, "family"]), pred_ms[fam])
    tab = pd.concat([order_classes(by_cls), by_fam.reindex([f for f in FAMILIES
                                                            if f in by_fam.index])])
    return tab.rename_axis(None).assign(**{MEAN: tab.mean(axis=1)})


def evaluate(predictors, root=None, level: int = 1, settings: Settings | None = None,
             **overrides) -> dict[str, pd.DataFrame]:
    """``{predictor name: error_table}`` for registered predictors trained on the NeuSight
    training GPUs. A KernelBench GPU whose ``Device`` is a training GPU's (the T4) is that GPU
    measured again by another harness; the others were never trained on. The frame with a
    ``pred_<name>`` column per predictor is under the key ``"frame"``, the skipped problems of
    :func:`problem_rows` under ``"skipped"``. Predictors train with ``settings`` and the
    training ``overrides`` of :func:`nslib.predictors.trained`."""
    from nslib.predictors import trained

    s = settings_of(settings)
    data, progress = s.data, s.progress
    frame, skipped = problem_rows(root, level, progress=progress)
    if not len(frame):
        raise ValueError("no KernelBench problem maps to one kernel of an nslib class: check "
                         "the folder (see `nslib eval-kernels --kernelbench DIR`)")
    out = {}
    for name in [predictors] if isinstance(predictors, str) else predictors:
        pred = trained(name, s, **overrides)
        frame[f"pred_{name}"] = predict(pred, frame, data)
        out[name] = error_table(frame, frame[f"pred_{name}"])
    out["frame"], out["skipped"] = frame, skipped
    return out


def table_json(tab: pd.DataFrame) -> dict:
    """``{class or family: {GPU: mape}}`` of an :func:`error_table` (GPU columns only)."""
    return {r: {g: round(float(v), 4) for g, v in row.items() if g != MEAN and pd.notna(v)}
            for r, row in tab.iterrows()}
