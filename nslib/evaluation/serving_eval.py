"""Serving forecasts against aiconfigurator's measured sample: TTFT and TPOT per engine, model
and GPU, with a roofline serving forecast (the same scheduling over roofline kernel times)
beside nslib's.

:func:`predict_sample` prices every row :func:`nslib.data.serving_sample.serving_rows` can
price (one :class:`nslib.model.serving.StepCost` per model, GPU and tensor-parallel degree;
each group's rows in one vectorised :func:`nslib.model.serving.serve` call);
:func:`error_table` summarises; :func:`unpriced` counts the other rows by reason.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.data.serving_sample import serving_rows
from nslib.data.settings import Settings
from nslib.kernels import measured
from nslib.evaluation.metrics import ape
from nslib.model.serving import ScaledCost, ServingSetup, StepCost, part_factors, serve
from nslib.model.stream16 import TENSOR_KINDS
from nslib.predictors import trained
from nslib.predictors.mixed_training import kind_table

METHODS = {"nslib": ("nslib", "nslib"), "roofline": ("roofline", "roofline")}


def predict_sample(rows: pd.DataFrame | None = None, methods=("nslib", "roofline"),
                   quick: bool = False, data=None, sample=None, mixed=None,
                   progress: bool = False, held_out: bool = False) -> pd.DataFrame:
    """The priced rows of the sample with ``<method>_ttft_ms`` and ``<method>_tpot_ms`` for
    each of ``methods`` (keys of :data:`METHODS`: vector and tensor predictor names), and the
    bounds where calibrations are cached. ``held_out``: each GPU's rows priced by predictors
    that never saw its kernels (:func:`unseen_predictors`). Rows whose model cannot be set up
    on their GPU (e.g. a tp that does not divide the heads) are left out and listed, with the
    reason, in ``attrs["not_priced"]``."""
    rows = serving_rows(sample, mixed) if rows is None else rows
    rows = rows[rows["reason"] == ""].copy()
    groups = list(rows.groupby(["config", "gpu", "tp_size"], sort=True))
    failed = pd.Series("", index=rows.index, dtype=object)
    seen = measured_gpus(quick, data, mixed) if held_out else None   # read once, not per group
    for method in methods:
        names = METHODS[method]
        bounds = part_factors(*names, quick, data)
        cols = {f"{method}_{k}": np.full(len(rows), np.nan) for k in (
            "ttft_ms", "tpot_ms", "ttft_lo_ms", "ttft_hi_ms", "tpot_lo_ms", "tpot_hi_ms",
            "ttft_lone_ms", "ttft_burst_ms")}
        for (config, gpu, tp), g in _bar(groups, progress, f"serving ({method})"):
            vec, tensor = (unseen_predictors(names, gpu, quick, data, mixed, seen) if held_out
                           else names)
            try:
                cost = StepCost(ServingSetup(config, gpu, tp=int(tp), predictor=vec,
                                             tensor_predictor=tensor, quick=quick, data=data))
            except ValueError as e:   # e.g. a tp that does not divide the heads: said, kept
                failed.loc[g.index] = f"{method}: {str(e).splitlines()[0]}"
                continue
            for fw, h in g.groupby("framework"):
                sel = rows.index.get_indexer(h.index)
                runs = {"": cost}
                if bounds is not None:
                    runs.update(_lo=ScaledCost(cost, bounds[0]), _hi=ScaledCost(cost, bounds[1]))
                for tag, c in runs.items():
                    out = serve(c, h["batch_size"], h["isl"], h["osl"], fw)
                    for k in ("ttft", "tpot"):
                        cols[f"{method}_{k}{tag}_ms"][sel] = out[f"{k}_ms"]
                    if not tag:   # TTFT were the requests to arrive alone / all at once
                        for k in ("ttft_lone", "ttft_burst"):
                            cols[f"{method}_{k}_ms"][sel] = out[f"{k}_ms"]
        for k, v in cols.items():
            if not np.isnan(v).all():
                rows[k] = v
    out = rows[failed == ""].copy()
    out.attrs["not_priced"] = rows.loc[failed != "", ["model_path", "system", "tp_size"]] \
        .assign(reason=failed[failed != ""])
    return out


def measured_gpus(quick: bool = False, data=None, mixed=None) -> dict[str, set]:
    """``{kind: Device names}`` of the GPUs whose kernels train each predictor kind: ``fp32``
    (the FP32 training GPUs) and the 16-bit :data:`TENSOR_KINDS`."""
    out = {"fp32": set(measured.gpu_splits(data)["train_gpus"])}
    out.update({kind: set(kind_table(kind, quick, mixed)["gpu"]) for kind in TENSOR_KINDS})
    return out


def unseen_predictors(names, gpu: str, quick: bool = False, data=None, mixed=None,
                      seen: dict | None = None):
    """(vector predictor, tensor predictors) of ``names`` (a :data:`METHODS` value) that
    never saw ``gpu`` (a Device name): the 16-bit GEMM and attention predictors trained
    without its kernels where the 16-bit data measures them, the FP32 one without them where
    it is one of the FP32 training GPUs (leave-one-GPU-out folds, cached); names unchanged
    where the data never measured the GPU. ``seen``: :func:`measured_gpus` when the caller
    holds it."""
    vec, tensor = names
    seen = measured_gpus(quick, data, mixed) if seen is None else seen
    settings = Settings(quick=quick, data=data, mixed=mixed)
    if gpu in seen["fp32"]:
        vec = trained(vec, settings, exclude_gpus=[gpu])
    pair = tuple(trained(tensor, settings, kind=kind,
                         exclude_gpus=[gpu] if gpu in seen[kind] else [])
                 for kind in TENSOR_KINDS)
    return vec, pair


def _bar(items, progress: bool, desc: str):
    if not progress:
        return items
    from tqdm.auto import tqdm
    return tqdm(items, desc=desc, leave=False)


def error_table(pred: pd.DataFrame, by=("framework", "model_path", "gpu"),
                methods=("nslib", "roofline")) -> pd.DataFrame:
    """Per group of ``by``: ``n`` and, per method, TTFT and TPOT MAPE (%), median
    predicted / measured ratio and, where the forecast has an interval, the share of
    measurements inside it (``<method>_ttft_covered``, %); the share of measured TTFTs
    between the forecast's lone-arrival and burst TTFTs (``<method>_ttft_in_arrivals``, %)."""
    out = []
    for key, g in pred.groupby(list(by), sort=True):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)), n=len(g))
        for m in methods:
            for what in ("ttft", "tpot"):
                p, y = g[f"{m}_{what}_ms"].to_numpy(float), g[f"silicon_{what}_ms"].to_numpy(float)
                row[f"{m}_{what}_mape"] = float(np.mean(ape(p, y)))
                row[f"{m}_{what}_ratio"] = float(np.median(p / y))
                if f"{m}_{what}_lo_ms" in g:   # the calibrated interval's coverage, %
                    lo, hi = g[f"{m}_{what}_lo_ms"], g[f"{m}_{what}_hi_ms"]
                    row[f"{m}_{what}_covered"] = float(100 * ((y >= lo) & (y <= hi)).mean())
            if f"{m}_ttft_lone_ms" in g:
                y = g["silicon_ttft_ms"]
                row[f"{m}_ttft_in_arrivals"] = float(100 * ((y >= g[f"{m}_ttft_lone_ms"]) &
                                                            (y <= g[f"{m}_ttft_burst_ms"])).mean())
        out.append(row)
    return pd.DataFrame(out)


def waiting_requests(rows: pd.DataFrame) -> pd.DataFrame:
    """How many requests an engine keeps waiting, read off the measurements alone: per
    group of rows that differ only in the output length (same engine, model, GPU, prompt
    length, concurrency and tensor-parallel degree; at least two lengths), the least-squares
    slope of the measured TTFT against one interval between completions, ``osl x TPOT /
    concurrency`` (measured TPOT). By Little's law a request that always waits adds one such
    interval to the mean TTFT: slope 1; none, 0. Per engine and concurrency: ``groups`` and
    the slopes' median, 10th and 90th percentiles (:mod:`nslib.model.serving.schedule`)."""
    keys = ["framework", "model_path", "gpu", "isl", "batch_size", "tp_size"]
    slopes = []
    for key, g in rows.groupby(keys, sort=True):
        if g["osl"].nunique() < 2:
            continue
        gap = (g["osl"] * g["silicon_tpot_ms"] / g["batch_size"]).to_numpy(float)
        ttft = g["silicon_ttft_ms"].to_numpy(float)
        slope = np.polyfit(gap, ttft, 1)[0]
        slopes.append(dict(zip(keys, key), slope=float(slope)))
    frame = pd.DataFrame(slopes, columns=keys + ["slope"])
    by = frame.groupby(["framework", "batch_size"], sort=True)["slope"]
    return pd.DataFrame({"groups": by.size(), "median": by.median(),
                         "p10": by.quantile(0.1), "p90": by.quantile(0.9)})


def unpriced(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows the forecast cannot price, counted by reason (and by model within it)."""
    bad = rows[rows["reason"] != ""]
    return (bad.groupby(["reason", "model_path"]).size().rename("rows").reset_index()
            .sort_values(["reason", "model_path"], ignore_index=True))


def summary_json(table: pd.DataFrame, rows: pd.DataFrame, method: str = "nslib") -> dict:
    """``{framework/model: {GPU: {ttft_mape, tpot_mape, n}}}`` plus ``unpriced``:
    ``{reason: rows}``."""
    out: dict = {}
    for r in table.itertuples(index=False):
        d = r._asdict()
        out.setdefault(f"{d['framework']}/{d['model_path']}", {})[d["gpu"]] = {
            "ttft_mape": round(float(d[f"{method}_ttft_mape"]), 2),
            "tpot_mape": round(float(d[f"{method}_tpot_mape"]), 2), "n": int(d["n"])}
    out["unpriced"] = {k: int(v) for k, v in
                       rows[rows["reason"] != ""]["reason"].value_counts().items()}
    return out
