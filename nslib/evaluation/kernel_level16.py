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

from nslib.data.gpus import gpu_matches, load_mixed_gpus
from nslib.data.mixed_data import measured_gpus
from nslib.data.settings import Settings
from nslib.evaluation.metrics import ape
from nslib.predictors import trained
from nslib.predictors.mixed_training import KINDS, kind_table


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


def logo_over(table: pd.DataFrame, fit_without: Callable, progress: bool = False) -> np.ndarray:
    """Leave-one-GPU-out predictions (ms) of ``table``'s rows, the one fold loop of the 16-bit
    tables: each measured GPU's rows priced by ``fit_without([gpu])``, a predictor fitted on
    every other GPU (:func:`logo_frame` passes the cached trainer, a test a small fit)."""
    pred = np.full(len(table), np.nan)
    for gpu in tqdm(measured_gpus(table), desc="leave-one-GPU-out", disable=not progress):
        rows = (table["gpu"] == gpu).to_numpy()
        pred[rows] = fit_without([gpu]).predict(table[rows].reset_index(drop=True))
    return pred


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
    settings = Settings(quick=quick, seed=seed, progress=progress, mixed=mixed)
    preds = {}
    for name in names:  # the training table stays free of prediction columns
        preds[f"pred_{name}"] = logo_over(
            table, lambda held, name=name: trained(name, settings, kind=kind, exclude_gpus=held,
                                                   table=table))
    return table.assign(**preds)


def test_gpus_frame(kind: str, names, test_gpus, seed: int = 0, quick: bool = False,
                    mixed=None, progress: bool = True) -> pd.DataFrame:
    """Rows of the ``test_gpus`` (Device names) with ``pred_<name>`` columns, each predictor
    trained on every other measured GPU."""
    table = kind_table(kind, quick, mixed)
    rows = table["gpu"].isin(test_gpus).to_numpy()
    out = table[rows].reset_index(drop=True)
    settings = Settings(quick=quick, seed=seed, progress=progress, mixed=mixed)
    for name in names:
        out[f"pred_{name}"] = trained(name, settings, kind=kind, exclude_gpus=list(test_gpus),
                                      table=table).predict(out)
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
