"""Per-class model-level errors: predicted ms per kernel class against the measured per-node
latencies of the one-layer label CSVs (repeated n_layer times; see :mod:`nslib.opgraph`)."""
from __future__ import annotations

import json

import pandas as pd

from .evaluate import ape
from .graph import load_model_config
from .opgraph import measured_per_class
from .predict import predict_model

CLASSES = ("linear", "bmm", "elementwise", "softmax", "layernorm", "memory")


def _n_layer(config: dict) -> int:
    for k in ("n_layer", "num_hidden_layers", "num_layers"):
        if k in config:
            return int(config[k])
    raise ValueError("model config has no layer count (n_layer / num_hidden_layers)")


def per_class_results(results: pd.DataFrame, predictor: str, data=None,
                      quick: bool = False) -> pd.DataFrame:
    """One row per (label with a CSV, class): measured ms, predicted ms, APE, ood flag.

    ``results`` is :func:`nslib.model_eval.evaluate_models` output (its rows name the labels).
    """
    rows = []
    labs = results[results["predictor"] == predictor].drop_duplicates(["gpu_key", "tag"])
    for _, r in labs.iterrows():
        meas = measured_per_class(r["gpu_key"], r["tag"],
                                  _n_layer(load_model_config(r["model"], data)), data)
        if meas is None:
            continue
        _, s = predict_model(r["gpu_key"], r["model"], r["batch"], r["seq"], r["mode"],
                             predictor=predictor, data=data, quick=quick)
        for cls in CLASSES:
            if cls in meas and meas[cls] > 0:
                rows.append({"gpu": r["gpu"], "tag": r["tag"], "cls": cls,
                             "measured_ms": float(meas[cls]),
                             "pred_ms": s["per_class_ms"].get(cls, 0.0),
                             "ood": bool(r["new_gpu"] or r["ood_model"])})
    out = pd.DataFrame(rows)
    if len(out):
        out["err"] = ape(out["pred_ms"], out["measured_ms"])
    return out


def per_class_table(per_class: pd.DataFrame) -> pd.DataFrame:
    """Mean APE per class, in-distribution vs out-of-distribution columns."""
    if per_class.empty:
        return pd.DataFrame(columns=["in-distribution", "out-of-distribution"])
    tab = per_class.pivot_table(index="cls", columns="ood", values="err", aggfunc="mean")
    return tab.rename(columns={False: "in-distribution", True: "out-of-distribution"})
