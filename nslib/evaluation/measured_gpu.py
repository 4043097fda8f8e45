"""Forecasts made from a datasheet alone, against a GPU this project measured itself
(``nslib collect``, :mod:`nslib.evaluation.collect`).

The collected folder's GPU is never trained on: the FP32 predictors are those trained on the
data's training GPUs, the 16-bit ones those trained on every GPU of the 16-bit data, and each
predicts the collected GPU from its datasheet (tiles looked up, as for any unprofiled GPU).
Three checks, each a frame with the measured ``latency_ms`` and a ``pred_<name>`` column per
predictor: FP32 kernels by class (:func:`fp32_kernels`), BF16 GEMMs and attention
(:func:`tensor_kernels`), and whole model steps (:func:`model_steps`); :func:`error_table` turns
any of them into MAPE, median predicted/measured and row counts per group.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from nslib.data import mixed_data
from nslib.data.gpus import load_gpus
from nslib.data.labels import load_labels
from nslib.data.paths import DataNotFoundError
from nslib.data.settings import Settings
from nslib.evaluation.collect.layout import MIXED, NEUSIGHT, asplos
from nslib.evaluation.collect.steps import config_source
from nslib.evaluation.kernel_level import predict_rows
from nslib.evaluation.metrics import ape
from nslib.kernels import measured, sizes
from nslib.kernels.clock import with_clock
from nslib.model.predict import predict_model
from nslib.model.step import Step
from nslib.predictors import trained
from nslib.predictors.intervals import calibration, tensor_calibration

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "datasets" / "measured"
FP32_PREDICTORS = ("nslib", "neusight", "roofline", "habitat", "li")
TENSOR_PREDICTORS = ("nslib", "roofline", "roofline_eff", "xgboost")
STEP_PREDICTORS = ("nslib", "neusight", "roofline")
INTERVAL_PREDICTORS = ("nslib",)  # steps priced with their interval (calibrations built)


def _is_collection(path: Path) -> bool:
    return (asplos(path) / "data" / "device_configs").is_dir()


def roots(folder) -> tuple[Path, Path]:
    """(NeuSight data root, 16-bit data root) of a collection; a clear error when it is not one."""
    folder = Path(folder)
    if not _is_collection(folder):
        raise DataNotFoundError(f"{folder} is not an `nslib collect` output (no {NEUSIGHT}/"
                                "scripts/asplos/data/device_configs): pass the folder "
                                "`nslib collect --out` wrote")
    return asplos(folder), folder / MIXED


def datasheet(folder):
    """The collected GPU's datasheet (:class:`nslib.data.gpus.GPU`); the folder holds one."""
    gpus = list(load_gpus(roots(folder)[0]).values())
    if len(gpus) != 1:
        raise ValueError(f"{folder} holds {len(gpus)} datasheets; a collection measures one GPU")
    return gpus[0]


def fp32_kernels(folder, predictors=FP32_PREDICTORS, data=None, quick: bool = False,
                 seed: int = 0) -> pd.DataFrame:
    """The collected FP32 kernels of every class with a ``pred_<name>`` column (ms) per
    predictor, each trained on the data's training GPUs."""
    root = roots(folder)[0]
    parts = []
    for cls in sizes.CLASSES:
        try:
            parts.append(measured.build_table(cls, "test", root))
        except DataNotFoundError:
            continue  # a collection without this class
    if not parts:
        raise DataNotFoundError(f"{root}: no FP32 kernel table of any class "
                                f"({', '.join(sizes.CLASSES)}) in the collection's test split; "
                                "`nslib collect` writes them")
    # the datasheet clock, which nslib's GEMM issue bound needs (nslib.kernels.issue_rate)
    frame = with_clock(pd.concat(parts, ignore_index=True), load_gpus(root))
    unseen = np.ones(len(frame), bool)  # never profiled: tiles are looked up
    for name in predictors:
        pred = trained(name, Settings(data=data, quick=quick, seed=seed, progress=False))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # range notes: the check reports the errors
            frame[f"pred_{name}"] = predict_rows(pred, frame, unseen)
    return frame


def tensor_kernels(folder, predictors=TENSOR_PREDICTORS, mixed=None, quick: bool = False,
                   seed: int = 0) -> pd.DataFrame:
    """The collected BF16 GEMMs (``kind`` gemm) and attention kernels (``kind`` attention,
    ``phase`` prefill/decode) with ``pred_<name>`` columns, each predictor trained on every GPU
    of the 16-bit data."""
    root = roots(folder)[1]
    tables = {"gemm": mixed_data.gemm_table(root), "attention": mixed_data.attention_table(root)}
    parts = []
    for kind, table in tables.items():
        table = table.assign(kind=kind)
        for name in predictors:
            model = trained(name, Settings(quick=quick, seed=seed, progress=False, mixed=mixed),
                            kind=kind)
            table[f"pred_{name}"] = model.predict(table.reset_index(drop=True))
        parts.append(table)
    frame = pd.concat(parts, ignore_index=True)
    frame["phase"] = frame["phase"].fillna("gemm")
    return frame


def _step_prediction(gpu_file, row, name: str, data, quick: bool) -> tuple[float, float, float]:
    """(forecast, interval low, interval high) in ms of one labelled step; the interval is
    NaN where the predictor has no cached calibration (``nslib calibrate``)."""
    dtype = row["variant"] if row["variant"] in ("bf16", "fp16") else "fp32"
    kw = {}
    if dtype != "fp32":
        if name == "neusight":
            return np.nan, np.nan, np.nan  # the paper's method is FP32 only
        kw["tensor_predictor"] = name if name == "roofline" else "nslib"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # range notes: the check reports errors, not notes
        _, summary = predict_model(str(gpu_file), config_source(row["model"]),
                                   Step(row["batch"], row["seq"], row["mode"], dtype), name,
                                   settings=Settings(data=data, quick=quick), **kw)
    lo, hi = summary.get("interval_ms", (np.nan, np.nan))
    return float(summary["e2e_ms"]), float(lo), float(hi)


def model_steps(folder, predictors=STEP_PREDICTORS, data=None, quick: bool = False,
                intervals=INTERVAL_PREDICTORS) -> pd.DataFrame:
    """The collected model steps (labels): ``tag, model, mode, seq, batch, dtype,
    latency_ms`` and a ``pred_<name>`` column per predictor (NaN where it cannot price the
    step, e.g. the paper's FP32 method on a 16-bit step), with ``lo_<name>``/``hi_<name>``
    (the step's calibrated interval, ms) for the predictors in ``intervals``: their
    calibrations are built first, so the table never depends on what a cache happens to
    hold (the 16-bit one only when a 16-bit step is there: it needs the 16-bit data)."""
    root = roots(folder)[0]
    gpu = datasheet(folder)
    gpu_file = root / "data" / "device_configs" / f"{gpu.key}.json"
    labels = load_labels(root)
    labels = labels[labels["variant"].isin(["", "bf16", "fp16"])].reset_index(drop=True)
    for name in set(intervals) & set(predictors):
        calibration(name, data=data, quick=quick)
        if (labels["variant"] != "").any():
            tensor_calibration(name, quick=quick)
    out = labels[["tag", "model", "mode", "seq", "batch"]].assign(
        dtype=labels["variant"].replace("", "fp32"), latency_ms=labels["e2e_ms"])
    for name in predictors:
        got = np.array([_step_prediction(gpu_file, r, name, data, quick)
                        for _, r in labels.iterrows()], float).reshape(-1, 3)
        out[f"pred_{name}"] = got[:, 0]
        if name in intervals:  # the calibrated interval (lo/hi_<name>, ms)
            out[f"lo_{name}"], out[f"hi_{name}"] = got[:, 1], got[:, 2]
    return out


def error_table(frame: pd.DataFrame, by) -> pd.DataFrame:
    """Per group of ``by``: MAPE (%) of each predictor, the median predicted/measured ratio of
    each (``ratio_<name>``) and the number of rows ``n``."""
    names = [c.removeprefix("pred_") for c in frame.columns if c.startswith("pred_")]
    cols = {}
    for n in names:
        cols[n] = ape(frame[f"pred_{n}"], frame["latency_ms"])
        cols[f"ratio_{n}"] = frame[f"pred_{n}"].to_numpy(float) / frame["latency_ms"].to_numpy()
    err = pd.DataFrame(cols, index=frame.index)
    keys = [frame[b] for b in ([by] if isinstance(by, str) else by)]
    agg = {n: "mean" for n in names} | {f"ratio_{n}": "median" for n in names}
    tab = err.groupby(keys, sort=False).agg(agg)
    tab["n"] = frame.groupby(keys, sort=False).size()
    return tab


def collections(root) -> list[Path]:
    """Every ``nslib collect`` output under ``root`` (sorted; ``root`` itself when it is one)."""
    root = Path(root)
    found = [root] if _is_collection(root) else []
    found += [p for p in sorted(root.iterdir()) if p.is_dir() and _is_collection(p)] \
        if root.is_dir() else []
    return found


def report(folder, fp32=FP32_PREDICTORS, tensor=TENSOR_PREDICTORS, steps=STEP_PREDICTORS,
           data=None, mixed=None, quick: bool = False, seed: int = 0) -> dict:
    """The three checks of one collection: ``{"gpu", "fp32", "tensor", "steps"}``, each check
    ``{"rows": frame, "errors": error_table}`` (FP32 by class, 16-bit by kind and phase, steps
    by dtype; the steps' rows carry each step's APE per predictor too)."""
    out = {"gpu": datasheet(folder).name}
    if fp32:
        rows = fp32_kernels(folder, fp32, data, quick, seed)
        out["fp32"] = {"rows": rows, "errors": error_table(rows, "cls")}
    if tensor:
        rows = tensor_kernels(folder, tensor, mixed, quick, seed)
        out["tensor"] = {"rows": rows, "errors": error_table(rows, ["kind", "phase"])}
    if steps:
        rows = model_steps(folder, steps, data, quick)
        for n in steps:
            rows[f"err_{n}"] = ape(rows[f"pred_{n}"], rows["latency_ms"])
        out["steps"] = {"rows": rows, "errors": error_table(rows, "dtype")}
    return out


def _label(key) -> str:
    """A group key as text: a tuple's distinct parts joined by ``/`` (``gemm``, not
    ``gemm/gemm``)."""
    return "/".join(dict.fromkeys(map(str, key))) if isinstance(key, tuple) else str(key)


def _num(v, digits: int):
    """``v`` rounded for JSON, None where it is missing."""
    return round(float(v), digits) if pd.notna(v) else None


def report_json(rep: dict) -> dict:
    """A :func:`report` as JSON-ready numbers: per check, ``{group: {predictor: MAPE}}`` plus
    ``n`` and ``median_ratio`` (``{predictor: median predicted / measured}``; groups joined by
    ``/``), and each step's measured and predicted ms."""
    out = {"gpu": rep["gpu"]}
    for check in ("fp32", "tensor", "steps"):
        if check not in rep:
            continue
        tab = rep[check]["errors"]
        names = [c for c in tab.columns if not c.startswith("ratio_") and c != "n"]
        ratios = [c for c in tab.columns if c.startswith("ratio_")]
        out[check] = {_label(k): {**{n: _num(r[n], 2) for n in names}, "n": int(r["n"]),
                                  "median_ratio": {c.removeprefix("ratio_"): _num(r[c], 3)
                                                   for c in ratios}}
                      for k, r in tab.iterrows()}
    if "steps" in rep:
        rows = rep["steps"]["rows"]
        preds = [c for c in rows.columns if c.startswith("pred_")]
        out["step_rows"] = {r["tag"]: {"measured_ms": round(float(r["latency_ms"]), 3),
                                       **{c.removeprefix("pred_"): (round(float(r[c]), 3)
                                          if pd.notna(r[c]) else None) for c in preds}}
                            for _, r in rows.iterrows()}
    return out


def provenance_table(folder) -> tuple[pd.DataFrame, dict]:
    """(rows, seconds and skipped items per part and run, the latest run's record) of a
    collection's ``provenance.json``; a model step skipped counts once, whatever its reason."""
    import json

    rec = json.loads((Path(folder) / "provenance.json").read_text())
    runs = rec.get("earlier_runs", []) + [rec]
    rows = {f"{part} (run {i + 1})": {
        "rows": r["rows"], "seconds": r["seconds"],
        "skipped": sum(v if isinstance(v, int) else 1 for v in r["skipped"].values()),
        "stopped by": r.get("error", "")}
        for i, run in enumerate(runs) for part, r in run["parts"].items()}
    return pd.DataFrame(rows).T, rec


def kernels_run(folder, top: int = 2) -> pd.DataFrame:
    """Which kernels the collected rows ran: per table, the ``top`` most frequent kernel names
    (cut to 60 characters) and their share of the table's rows (%)."""
    root = Path(folder)
    rows = []
    for path in sorted(root.rglob("*.parquet")) + sorted(root.rglob("test/*.csv")):
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        col = "kernel_name" if "kernel_name" in frame else "Kernel Name"
        if col not in frame:
            continue
        counts = frame[col].astype(str).str[:60].value_counts(normalize=True).head(top)
        rows += [{"table": path.stem, "kernel": k, "share %": round(100 * v, 1)}
                 for k, v in counts.items()]
    return pd.DataFrame(rows)


def stem_of(rep: dict) -> str:
    """A file-name stem for a report's GPU (its Device name, lower case, words joined)."""
    return "_".join("".join(c if c.isalnum() else " " for c in rep["gpu"].lower()).split())


def _best(tab: pd.DataFrame) -> dict:
    names = [c for c in tab.columns if not c.startswith("ratio_") and c != "n"]
    return {_label(k): tab.loc[k, names].astype(float).idxmin() for k in tab.index}


def reading(rep: dict, check: str, ours: str = "nslib") -> str:
    """A few sentences on one check of a :func:`report`, every number computed from it: the
    mean error of ``ours`` and of the others, the direction of its errors (median ratio), the
    best predictor per group, and for steps the interval coverage where there is one."""
    tab, rows = rep[check]["errors"], rep[check]["rows"]
    names = [c for c in tab.columns if not c.startswith("ratio_") and c != "n"]
    if ours not in names:
        return f"{rep['gpu']}: {check} has no {ours} forecasts"
    err = {n: float(np.nanmean(ape(rows[f"pred_{n}"], rows["latency_ms"]))) for n in names}
    others = ", ".join(f"{n} {v:.1f}%" for n, v in err.items() if n != ours and np.isfinite(v))
    ratio = tab[f"ratio_{ours}"]
    worst = ratio.sub(1).abs().idxmax()
    worst_name = _label(worst)
    text = [f"{rep['gpu']}, {check}: {ours} is {err[ours]:.1f}% off on average over "
            f"{len(rows)} rows ({others}).",
            f"By group, {ours}'s median predicted/measured runs from {ratio.min():.2f} to "
            f"{ratio.max():.2f}; furthest from 1 in {worst_name} ({ratio[worst]:.2f}: "
            f"{'too slow' if ratio[worst] > 1 else 'too fast'}).",
            "Best per group: " + ", ".join(f"{g} {n}" for g, n in _best(tab).items()) + "."]
    if check == "steps" and f"lo_{ours}" in rows:
        ok = rows[f"lo_{ours}"].notna()
        inside = ((rows["latency_ms"] >= rows[f"lo_{ours}"]) &
                  (rows["latency_ms"] <= rows[f"hi_{ours}"]))[ok]
        text.append(f"{ours}'s calibrated interval holds {int(inside.sum())} of {int(ok.sum())}"
                    f" measured steps ({100 * inside.mean():.0f}%).")
    return " ".join(text)
