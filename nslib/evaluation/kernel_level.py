"""Kernel-level evaluation of any registered predictor, for both kinds of kernel tables.

FP32 (NeuSight's five classes): the test split under the paper's protocol (method.md section
8) and leave-one-GPU-out over the training GPUs beside it. 16-bit (GEMM and attention
tables): leave-one-GPU-out over every GPU a table measures, or named test GPUs. The folds are
:func:`nslib.predictors.folds`, the one fold loop of every table; the training GPUs are the
GPUs with rows in the data, never a list in code.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.data.gpus import gpu_matches, load_gpus, load_mixed_gpus
from nslib.data.mixed_data import measured_gpus
from nslib.data.settings import Settings, settings_of
from nslib.evaluation.metrics import ape, class_table, order_classes
from nslib.kernels import measured
from nslib.kernels.clock import with_clock
from nslib.predictors import folds, trained
from nslib.predictors.mixed_training import KINDS, kind_table
from nslib.predictors.training import kernel_eval_frame

LOGO_MEAN = "mean (training GPUs held out)"
WORST = "worst held-out GPU"


def clocked_eval_frame(data=None) -> pd.DataFrame:
    """The test kernels (:func:`kernel_eval_frame`) with each GPU's datasheet clock, which
    nslib's GEMM issue bound needs (:mod:`nslib.kernels.issue_rate`)."""
    return with_clock(kernel_eval_frame(data), load_gpus(data))


def predict_rows(pred, frame: pd.DataFrame, unseen: np.ndarray) -> np.ndarray:
    """Latency (ms) of every row; rows of GPUs the predictor never trained on (``unseen``)
    take looked-up tiles, as a GPU that was never profiled would."""
    if not hasattr(pred, "tiles"):
        return pred.predict(frame)
    out = np.empty(len(frame))
    if (~unseen).any():
        out[~unseen] = pred.predict(frame[~unseen])
    if unseen.any():
        out[unseen] = pred.predict(frame[unseen], lookup=True)
    return out


def predict_test(name: str, lookup: bool = False, settings: Settings | None = None,
                 **overrides) -> pd.DataFrame:
    """The test kernels with a ``pred_ms`` column from predictor ``name`` (trained with
    ``settings`` and the training ``overrides`` of :func:`nslib.predictors.trained`).

    Kernels of GPUs that are not training GPUs take looked-up tiles (as on a GPU never
    profiled); ``lookup=True`` looks up every kernel's tile.
    """
    s = settings_of(settings)
    frame = clocked_eval_frame(s.data)
    splits = measured.gpu_splits(s.data)
    pred = trained(name, s, **overrides)
    unseen = ~frame["gpu"].isin(splits["train_gpus"]).to_numpy() | lookup
    return frame.assign(pred_ms=predict_rows(pred, frame, unseen))


def evaluate_predictor(name: str, lookup: bool = False, settings: Settings | None = None,
                       **overrides) -> pd.DataFrame:
    """Per-class mean APE (%) on training GPUs and new GPUs, as ``nslib eval-kernels`` prints."""
    frame = predict_test(name, lookup, settings, **overrides)
    splits = measured.gpu_splits(settings_of(settings).data)
    return class_table(frame, frame["pred_ms"], splits["train_gpus"], splits["new_gpus"])


def predict_logo(name: str, settings: Settings | None = None, **overrides) -> pd.DataFrame:
    """Leave-one-GPU-out predictions of the test kernels of every GPU with measured kernels.

    Each training GPU is held out in turn: the predictor is trained on the other training GPUs
    (cached per fold) and predicts the held-out GPU's test kernels with looked-up tiles. GPUs
    without training kernels (the new GPUs) are predicted by the predictor trained on every
    training GPU, as in the paper's protocol. Adds ``pred_ms`` and ``held_out`` (True for the
    training GPUs' folds, False for the new GPUs).
    """
    s = settings_of(settings)
    frame = clocked_eval_frame(s.data)
    new = measured.gpu_splits(s.data)["new_gpus"]
    everyone = trained(name, s.but(progress=False), **overrides)  # prices the new GPUs
    held = [([g], pred, True) for g, pred in folds(name, s, **overrides)]
    parts = []
    for gpus, pred, was_held in held + [(new, everyone, False)]:
        sub = frame[frame["gpu"].isin(gpus)]
        if len(sub):
            parts.append(sub.assign(pred_ms=predict_rows(pred, sub, np.ones(len(sub), bool)),
                                    held_out=was_held))
    return pd.concat(parts, ignore_index=True)


def logo_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean APE (%) per class (rows) and GPU (columns) of :func:`predict_logo` output, with
    the mean over the held-out training GPUs and the worst of them as the last columns."""
    df = frame.assign(err=ape(frame["pred_ms"], frame["latency_ms"]))
    tab = df.pivot_table(index="cls", columns="gpu", values="err", aggfunc="mean")
    held = sorted(df.loc[df["held_out"], "gpu"].unique())
    tab = tab[held + sorted(c for c in tab.columns if c not in held)]
    return order_classes(with_logo_summary(tab, held))


def with_logo_summary(tab: pd.DataFrame, held) -> pd.DataFrame:
    """``tab`` (rows x GPU columns) with the mean over the held-out GPU columns ``held``
    (:data:`LOGO_MEAN`) and the worst of them (:data:`WORST`) as its last columns."""
    return tab.assign(**{LOGO_MEAN: tab[list(held)].mean(axis=1),
                         WORST: tab[list(held)].max(axis=1)})


def logo_json(tab: pd.DataFrame) -> dict:
    """``{class: {GPU Device name: mape}}`` of a :func:`logo_table` (GPU columns only)."""
    gpus = [c for c in tab.columns if c not in (LOGO_MEAN, WORST)]
    return {cls: {g: round(float(row[g]), 4) for g in gpus if pd.notna(row[g])}
            for cls, row in tab.iterrows()}


def evaluate_logo(name: str, settings: Settings | None = None, **overrides) -> pd.DataFrame:
    """:func:`logo_table` of :func:`predict_logo`: what ``nslib eval-kernels --logo`` prints."""
    return logo_table(predict_logo(name, settings, **overrides))


# ----- 16-bit kernel tables (GEMM, attention)
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


def logo_over(table: pd.DataFrame, held_out) -> np.ndarray:
    """Leave-one-GPU-out predictions (ms) of a 16-bit ``table``'s rows: each held-out GPU's
    rows priced by its fold's predictor, ``held_out`` yielding ``(gpu, predictor fitted on
    every other GPU)`` (:func:`logo_frame` passes :func:`nslib.predictors.folds`, a test its
    own small fits)."""
    pred = np.full(len(table), np.nan)
    for gpu, fitted in held_out:
        rows = (table["gpu"] == gpu).to_numpy()
        pred[rows] = fitted.predict(table[rows].reset_index(drop=True))
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
        preds[f"pred_{name}"] = logo_over(table, folds(name, settings, kind=kind, table=table))
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
