"""Error metrics with the paper's protocol: absolute percentage error, averaged per class,
split into the training GPUs and the new (never trained on) GPUs."""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.kernels.sizes import CLASSES


def ape(pred_ms, measured_ms) -> np.ndarray:
    """Absolute percentage error per row, in percent: ``100 * |pred - measured| / measured``."""
    pred, meas = np.asarray(pred_ms, float), np.asarray(measured_ms, float)
    return 100.0 * np.abs(pred - meas) / meas


def class_table(frame: pd.DataFrame, pred_ms, train_gpus, new_gpus) -> pd.DataFrame:
    """Mean APE (percent) per kernel class on training GPUs and on new GPUs, with row counts.

    ``frame`` needs ``cls``, ``gpu`` and ``latency_ms``; returns a frame indexed by class with
    columns ``train_gpus``, ``new_gpus`` (NaN where a class has no such rows) and ``n``.
    """
    df = pd.DataFrame({"cls": frame["cls"].to_numpy(), "gpu": frame["gpu"].to_numpy(),
                       "err": ape(pred_ms, frame["latency_ms"])})
    df["group"] = np.where(df["gpu"].isin(list(train_gpus)), "train_gpus",
                           np.where(df["gpu"].isin(list(new_gpus)), "new_gpus", "other"))
    tab = df.pivot_table(index="cls", columns="group", values="err", aggfunc="mean")
    tab = tab.reindex(columns=["train_gpus", "new_gpus"])
    tab["n"] = df.groupby("cls").size()
    return order_classes(tab)


def order_classes(tab: pd.DataFrame) -> pd.DataFrame:
    """Rows of a class-indexed table in the kernel class order (others after)."""
    order = [c for c in CLASSES if c in tab.index]
    return tab.loc[order + [c for c in tab.index if c not in order]]


def gpu_table(frame: pd.DataFrame, pred_ms) -> pd.DataFrame:
    """Mean APE (percent) per class (rows) and GPU (columns)."""
    df = pd.DataFrame({"cls": frame["cls"].to_numpy(), "gpu": frame["gpu"].to_numpy(),
                       "err": ape(pred_ms, frame["latency_ms"])})
    return df.pivot_table(index="cls", columns="gpu", values="err", aggfunc="mean")


def table_json(tab: pd.DataFrame) -> dict:
    """``{cls: {"train_gpus": mape, "new_gpus": mape, "n": rows}}`` (NaN becomes None)."""
    out = {}
    for cls, row in tab.iterrows():
        out[cls] = {k: (None if pd.isna(row[k]) else round(float(row[k]), 4))
                    for k in ("train_gpus", "new_gpus")}
        out[cls]["n"] = int(row["n"])
    return out


def error_summary(results: pd.DataFrame, columns: str, all_name: str,
                  base_name: str) -> pd.DataFrame:
    """Mean ``err`` (%) per predictor (rows) and value of ``columns``; then the mean over every
    row (column ``all_name``) and the mean ``base_err`` of the same rows' baseline prediction
    (column ``base_name``)."""
    summary = results.pivot_table(index="predictor", columns=columns, values="err")
    by_predictor = results.groupby("predictor")
    summary[all_name] = by_predictor["err"].mean()
    summary[base_name] = by_predictor["base_err"].mean()
    return summary
