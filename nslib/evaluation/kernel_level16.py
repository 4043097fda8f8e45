"""Kernel-level evaluation of the 16-bit predictors: leave-one-GPU-out and named test GPUs.

A predictor here is any object with ``fit(frame)`` and ``predict(frame) -> ms`` (see
:class:`nslib.predictors.base.Predictor`); a *factory* makes a fresh, untrained one. The
training GPUs are the GPUs with rows in the table, never a list in code.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from nslib.data import mixed_data
from nslib.data.gpus import gpu_matches, load_mixed_gpus
from nslib.data.mixed_data import measured_gpus
from nslib.evaluation.metrics import ape
from nslib.predictors.mixed_training import KINDS, kind_table, trained_tensor


def resolve_gpus(table: pd.DataFrame, names, mixed=None) -> list[str]:
    """Device names of ``names`` (Device names, file stems, or unambiguous whole-word aliases,
    as :func:`nslib.data.gpus.gpu_matches` reads them) among the GPUs measured in ``table``;
    ValueError listing them if not."""
    known = measured_gpus(table)
    sheets = {k: g for k, g in load_mixed_gpus(mixed).items() if g.name in set(known)}
    out = []
    for q in names:
        hits = gpu_matches(q, sheets)
        if len(hits) != 1:
            why = "ambiguous" if hits else "not measured in this table"
            raise ValueError(f"GPU {q!r} is {why}; measured GPUs: {', '.join(known)}")
        out.append(hits[0].name)
    return out


def predict_held_out(table: pd.DataFrame, factory: Callable, held_out: list[str],
                     progress: bool = True) -> np.ndarray:
    """Predictions (ms) for the rows of the ``held_out`` GPUs by a predictor trained on every
    other GPU of ``table`` (NaN on the training rows)."""
    test = table["gpu"].isin(held_out).to_numpy()
    if not test.any() or test.all():
        raise ValueError(f"held-out GPUs {held_out} leave no test or no training rows")
    pred = np.full(len(table), np.nan)
    model = factory()
    model.fit(table[~test].reset_index(drop=True), progress=progress)
    pred[test] = model.predict(table[test].reset_index(drop=True))
    return pred


def logo_predictions(table: pd.DataFrame, factory: Callable, progress: bool = True) -> np.ndarray:
    """Leave-one-GPU-out predictions (ms): each GPU's rows predicted by a predictor trained on
    all the other GPUs of ``table``."""
    pred = np.full(len(table), np.nan)
    for gpu in tqdm(measured_gpus(table), desc="leave-one-GPU-out", disable=not progress):
        part = predict_held_out(table, factory, [gpu], progress=False)
        mask = ~np.isnan(part)
        pred[mask] = part[mask]
    return pred


def per_gpu_mape(table: pd.DataFrame, pred: np.ndarray) -> pd.Series:
    """MAPE (%) per GPU over the rows with a prediction (the held-out GPUs)."""
    ok = ~np.isnan(pred)
    err = pd.Series(ape(pred[ok], table["latency_ms"].to_numpy()[ok]),
                    index=table.index[ok])
    return err.groupby(table.loc[ok, "gpu"], sort=False).mean().rename("mape")


def evaluate_16bit(predictor: str = "nslib", test_gpus=None, seed: int = 0,
                   quick: bool = False, mixed=None, progress: bool = True) -> dict:
    """Per-kind MAPE (%) of one 16-bit predictor per GPU: ``{kind: {gpu Device name: mape}}``.

    Without ``test_gpus``, leave-one-GPU-out over every GPU the kind's table measures; with
    them (Device names, file stems or unambiguous aliases), one predictor trained on every
    other measured GPU predicts the named ones.
    """
    out = {}
    for kind in KINDS:
        if test_gpus:
            names = resolve_gpus(kind_table(kind, quick, mixed), test_gpus, mixed)
            frame = test_gpus_frame(kind, [predictor], names, seed, quick, mixed, progress)
        else:
            frame = logo_frame(kind, [predictor], seed, quick, mixed, progress)
        out[kind] = {g: round(float(v), 2) for g, v in mape_table(frame)[predictor].items()}
    return out


def logo_frame(kind: str, names, seed: int = 0, quick: bool = False, mixed=None,
               progress: bool = True) -> pd.DataFrame:
    """Leave-one-GPU-out predictions of each predictor in ``names``: the kind's table with a
    ``pred_<name>`` column (ms) per predictor, each GPU's rows predicted by the predictor
    trained on the others."""
    table = kind_table(kind, quick, mixed)
    gpus = mixed_data.measured_gpus(table)
    preds = {}
    for name in names:  # the training table stays free of prediction columns
        preds[f"pred_{name}"] = pred = np.full(len(table), np.nan)
        for gpu in gpus:
            rows = (table["gpu"] == gpu).to_numpy()
            model = trained_tensor(kind, name, seed, quick, [gpu], mixed, progress, table)
            pred[rows] = model.predict(table[rows].reset_index(drop=True))
    return table.assign(**preds)


def test_gpus_frame(kind: str, names, test_gpus, seed: int = 0, quick: bool = False,
                    mixed=None, progress: bool = True) -> pd.DataFrame:
    """Rows of the ``test_gpus`` (Device names) with ``pred_<name>`` columns, each predictor
    trained on every other measured GPU."""
    table = kind_table(kind, quick, mixed)
    rows = table["gpu"].isin(test_gpus).to_numpy()
    out = table[rows].reset_index(drop=True)
    for name in names:
        out[f"pred_{name}"] = trained_tensor(kind, name, seed, quick, list(test_gpus), mixed,
                                             progress, table).predict(out)
    return out


def mape_table(frame: pd.DataFrame, by=("gpu",)) -> pd.DataFrame:
    """MAPE (%) per group of ``by`` (rows) and predictor (columns) of a frame with
    ``pred_<name>`` columns."""
    cols = [c for c in frame.columns if c.startswith("pred_")]
    err = pd.DataFrame({c.removeprefix("pred_"): ape(frame[c], frame["latency_ms"])
                        for c in cols})
    for b in by:
        err[b] = frame[b].to_numpy()
    return err.groupby(list(by), sort=False).mean()
