"""Tables of the multi-GPU evaluation (notebook 07), from
:func:`nslib.evaluation.model_level.evaluate_variant` results of kind ``"distributed"`` with
``with_base=True``: step times in ms, errors in percent. Every function is pure over frames."""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.evaluation.metrics import error_summary

KEYS = ["gpu", "config", "strategy", "predictor"]
# result columns -> the results table's headers, in the table's order
PARALLEL_COLUMNS = {"e2e_ms": "measured ms", "pred_ms": "predicted ms", "err": "error %",
                    "comm_ms": "predicted comm ms", "base_batch": "1-GPU batch",
                    "base_e2e_ms": "1-GPU measured ms", "base_pred_ms": "1-GPU predicted ms",
                    "base_err": "1-GPU error %"}


def with_strategy(results: pd.DataFrame) -> pd.DataFrame:
    """``results`` with a ``strategy`` column naming the label variant: kind and degree
    (``dp4``, ``tp4``), and for pipelines the micro-batch count (``pp4_1``)."""
    pp = results["kind"] == "pp"
    suffix = np.where(pp, "_" + results["microbatches"].astype(str), "")
    return results.assign(strategy=results["kind"] + results["degree"].astype(str) + suffix)


def parallel_table(results: pd.DataFrame) -> pd.DataFrame:
    """Measured and predicted step (ms), error (%), predicted communication (ms) and the
    single-GPU batch, measurement, prediction and error of the same work, indexed by (gpu,
    config, strategy, predictor). ``results``: :func:`with_strategy` applied."""
    return results[KEYS + list(PARALLEL_COLUMNS)].rename(
        columns=PARALLEL_COLUMNS).set_index(KEYS)


def parallel_error_table(results: pd.DataFrame) -> pd.DataFrame:
    """Rows predictors, columns (GPU, config, strategy), cells percent error: the paper's
    layout. ``results``: :func:`with_strategy` applied."""
    return results.pivot_table(index="predictor", columns=KEYS[:3], values="err")


def parallel_summary(results: pd.DataFrame) -> pd.DataFrame:
    """Mean error (%) per predictor (rows) and parallel kind (columns), then over every
    label (``all``) and of the single-GPU predictions where a plain label exists
    (``1-GPU (where labelled)``)."""
    return error_summary(results, "kind", "all", "1-GPU (where labelled)")


def scaling_table(results: pd.DataFrame) -> pd.DataFrame:
    """Step time relative to one GPU running the same work, where that has a label:
    ``measured ratio`` (step / single-GPU step, both measured), ``predicted ratio`` (both
    predicted) and ``ratio error %`` (predicted over measured ratio, minus 1, in percent;
    signed). The ratio cancels the kernel predictor's single-GPU error. Indexed as
    :func:`parallel_table`."""
    rel = results.dropna(subset=["base_e2e_ms"]).copy()
    rel["measured ratio"] = rel["e2e_ms"] / rel["base_e2e_ms"]
    rel["predicted ratio"] = rel["pred_ms"] / rel["base_pred_ms"]
    rel["ratio error %"] = 100 * (rel["predicted ratio"] / rel["measured ratio"] - 1)
    cols = ["base_batch", "measured ratio", "predicted ratio", "ratio error %"]
    return rel.set_index(KEYS)[cols].rename(columns={"base_batch": "1-GPU batch"})
