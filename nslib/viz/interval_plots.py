"""Figures of the calibrated intervals (notebook 13)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd


def coverage_curve(curve: pd.DataFrame):
    """Achieved against nominal coverage (%), one line per class (``curve``: columns
    ``nominal``, ``cls``, ``covered``), the diagonal for reference."""
    fig, ax = plt.subplots(figsize=(5, 4.2))
    for c, g in curve.groupby("cls"):
        ax.plot(g["nominal"], g["covered"], marker="o", label=c)
    lim = [min(curve["nominal"].min(), curve["covered"].min()) - 5, 100]
    ax.plot(lim, lim, "k:", lw=0.8)
    ax.set(xlabel="nominal coverage (%)", ylabel="achieved on held-out GPUs (%)",
           title="kernel intervals, leave-one-GPU-out (nested)")
    ax.legend(fontsize=7)
    return fig


def e2e_intervals(frame: pd.DataFrame):
    """Measured step time against the prediction with its interval, per label, one panel per
    GPU (``frame``: :func:`nslib.evaluation.interval_eval.e2e_table` with a ``mode``)."""
    gpus = list(pd.unique(frame["gpu"]))
    fig, axes = plt.subplots(1, len(gpus), figsize=(4.5 * len(gpus), 4), squeeze=False)
    for ax, g in zip(axes[0], gpus):
        sub = frame[frame["gpu"] == g].reset_index(drop=True)
        x = range(len(sub))
        # the interval need not contain the forecast (a predictor that errs one way has
        # both bounds on one side of it): drawn as a bar of its own
        ax.vlines(list(x), sub["lo_ms"], sub["hi_ms"], lw=4, alpha=0.35, label="interval")
        ax.scatter(x, sub["pred_ms"], s=14, label="forecast")
        ax.scatter(x, sub["measured_ms"], marker="x", color="k", zorder=3, label="measured")
        ax.set_xticks(list(x), [f"{m} {md} b{b}" for m, md, b in
                                zip(sub["model"], sub["mode"], sub["batch"])],
                      rotation=90, fontsize=6)
        ax.set(yscale="log", ylabel="step time (ms)", title=g)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


__all__ = ["coverage_curve", "e2e_intervals"]
