"""How well the calibrated intervals hold: per kernel class on the leave-one-GPU-out folds
(nested: each GPU against the calibration of the others), with two baselines beside (the plain
``+- MAPE`` band and the plain spread of the predictor's ensemble members), and end to end on
the measured labels of the GPUs the predictor never trained on
(:mod:`nslib.predictors.intervals`)."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from nslib.data.settings import Settings
from nslib.evaluation.kernel_level import predict_rows
from nslib.evaluation.model_level import label_configs
from nslib.kernels import measured
from nslib.model.predict import predict_model
from nslib.model.step import Step
from nslib.predictors import folds
from nslib.predictors.intervals import (COVERAGE, calibration, logo_residuals,
                                        mape_band_coverage, nested_coverage, tensor_residuals)
from nslib.predictors.training import kernel_eval_frame


def kernel_table(name: str = "nslib", coverage: float = COVERAGE, data=None,
                 quick: bool = False, seed: int = 0) -> pd.DataFrame:
    """Per class: mean over held-out GPUs of the achieved coverage (%) and half-width (% of
    the prediction) of the calibrated interval and of the ``+- MAPE`` band, the worst GPU's
    coverage, and the residuals behind it."""
    out, base = coverage_table(logo_residuals(name, data, quick, seed), coverage)
    spread = ensemble_spread_coverage(name, data, quick, seed)
    if len(spread):
        base = base.join(spread.groupby("cls").agg(
            ensemble_covered=("covered", "mean"), ensemble_half_width=("half_width", "mean"),
            ensemble_members=("members", "first")))
    return out.join(base)


def coverage_table(res: pd.DataFrame, coverage: float = COVERAGE):
    """(calibrated, band) per class of the residuals ``res``: the nested check's mean
    coverage (%) over held-out GPUs, the worst GPU's, the mean half-width (% of the
    prediction) and the kernels; the ``+- MAPE`` band's coverage and half-width."""
    cal, band = nested_coverage(res, coverage), mape_band_coverage(res)
    out = cal.groupby("cls").agg(covered=("covered", "mean"), worst_gpu=("covered", "min"),
                                 half_width=("half_width", "mean"), kernels=("n", "sum"))
    base = band.groupby("cls").agg(mape_band_covered=("covered", "mean"),
                                   mape_band_half_width=("half_width", "mean"))
    return out, base


def tensor_kernel_table(name: str = "nslib", coverage: float = COVERAGE, quick: bool = False,
                        seed: int = 0, mixed=None) -> pd.DataFrame:
    """:func:`kernel_table` for the 16-bit GEMM and attention predictors (classes ``gemm``,
    ``attention``): each measured GPU of the 16-bit data against the calibration of the
    others' leave-one-GPU-out residuals, the ``+- MAPE`` band beside."""
    out, base = coverage_table(tensor_residuals(name, quick, seed, mixed), coverage)
    return out.join(base)


def kernelbench_coverage(name: str = "nslib", coverage: float = COVERAGE,
                         settings: Settings | None = None, root=None) -> pd.DataFrame:
    """The calibrated kernel intervals on a second family of GPUs never trained on:
    KernelBench's level-1 kernels (:mod:`nslib.evaluation.kernelbench`), each priced by
    predictor ``name`` trained on the NeuSight training GPUs, its interval around the kernel's
    GPU time and the campaign's per-call cost added to both bounds (the calibration is of
    kernel times; the harness is the campaign's). Rows ``(cls, gpu)``: ``kernels``,
    ``covered`` (%) and ``half_width`` (median, % of the prediction)."""
    from nslib.evaluation import kernelbench as kbe
    s = settings if settings is not None else Settings(progress=False)
    cal = calibration(name, s.data, s.quick, s.seed, coverage)
    frame = kbe.evaluate([name], root, settings=s)["frame"]
    pred = frame[f"pred_{name}"].to_numpy(float)
    harness = frame["campaign"].map(kbe.harness_ms(frame)).to_numpy(float)
    lo, hi = (harness + b for b in cal.kernel_interval(frame["cls"], pred - harness))
    y = frame["latency_ms"].to_numpy(float)
    rows = frame.assign(covered=100.0 * ((y >= lo) & (y <= hi)),
                        half_width=50.0 * (hi - lo) / pred)
    return rows.groupby(["cls", "gpu"]).agg(kernels=("covered", "size"),
                                            covered=("covered", "mean"),
                                            half_width=("half_width", "median"))


def members(pred) -> dict[str, list]:
    """``{class: [predictor of one ensemble member, ...]}`` for the classes ``pred`` trains
    an ensemble of more than one MLP for (each member a shallow copy pricing that class with
    its own MLP alone; a predictor without ensembles gives ``{}``)."""
    out = {}
    for cls, nets in getattr(pred, "models", {}).items():
        if len(nets) > 1:
            out[cls] = []
            for net in nets:
                one = copy.copy(pred)
                one.models = {**pred.models, cls: [net]}
                out[cls].append(one)
    return out


def ensemble_spread_coverage(name: str = "nslib", data=None, quick: bool = False,
                             seed: int = 0) -> pd.DataFrame:
    """The plain spread of an ensemble as an interval, on the same held-out kernels as
    :func:`nested_coverage`: each training GPU's test kernels priced by every member of the
    fold that never saw the GPU, the interval from the lowest member's price to the highest.
    Per class (those trained as ensembles) and GPU: ``covered`` (%), ``half_width`` (half the
    range, % of the members' mean) and ``members``."""
    frame = kernel_eval_frame(data)
    rows = []
    for g, pred in folds(name, Settings(data=data, quick=quick, seed=seed, progress=False)):
        for cls, preds in members(pred).items():
            sub = frame[(frame["gpu"] == g) & (frame["cls"] == cls)]
            if not len(sub):
                continue
            unseen = np.ones(len(sub), bool)
            p = np.stack([predict_rows(m, sub, unseen) for m in preds])
            y = sub["latency_ms"].to_numpy(float)
            inside = (y >= p.min(axis=0)) & (y <= p.max(axis=0))
            rows.append({"gpu": g, "cls": cls, "n": len(sub), "members": len(preds),
                         "covered": 100 * inside.mean(),
                         "half_width": float(np.mean(50 * np.ptp(p, axis=0) / p.mean(axis=0)))})
    return pd.DataFrame(rows)


def e2e_table(mode: str, name: str = "nslib", coverage: float = COVERAGE, data=None,
              quick: bool = False, seed: int = 0, gpus=None,
              progress: bool = False) -> pd.DataFrame:
    """Each label of the GPUs the predictor never trained on (``gpus``: default the data's
    new GPUs): measured and predicted ms, the interval, and whether it covers the label."""
    cal = calibration(name, data, quick, seed, coverage)   # the one asked for, built first
    gpus = gpus or measured.gpu_splits(data)["new_gpus"]
    lab = label_configs(mode, data, gpus)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _, r in tqdm(list(lab.iterrows()), desc=f"{mode} intervals", disable=not progress):
            try:
                _, s = predict_model(r["gpu_key"], r["model"], Step(r["batch"], r["seq"], mode),
                                     name, settings=Settings(data=data, quick=quick))
            except (ValueError, NotImplementedError, RuntimeError):
                continue
            lo, hi = cal.step_bounds(s["per_class_ms"], s["e2e_ms"]) or (np.nan, np.nan)
            rows.append({"gpu": r["gpu"], "model": r["model"], "batch": r["batch"],
                         "measured_ms": r["e2e_ms"], "pred_ms": s["e2e_ms"], "lo_ms": lo,
                         "hi_ms": hi})
    out = pd.DataFrame(rows)
    if len(out):
        out["covered"] = (out["measured_ms"] >= out["lo_ms"]) & \
            (out["measured_ms"] <= out["hi_ms"])
    return out


def e2e_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per GPU: labels, coverage (%) and the median half-width (% of the prediction)."""
    hw = 50 * (frame["hi_ms"] - frame["lo_ms"]) / frame["pred_ms"]
    return frame.assign(hw=hw).groupby("gpu").agg(
        labels=("covered", "size"), covered=("covered", lambda c: 100 * c.mean()),
        median_half_width=("hw", "median"))


__all__ = ["coverage_table", "e2e_summary", "e2e_table", "ensemble_spread_coverage",
           "kernel_table", "kernelbench_coverage", "members", "tensor_kernel_table"]
