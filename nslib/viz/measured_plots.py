"""Figures of forecasts against a GPU measured with ``nslib collect`` (notebook 14)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd


def error_bars(tab: pd.DataFrame, title: str):
    """Grouped bars of MAPE (%) per group (rows of ``tab``) and predictor (its columns that
    are not ``ratio_*`` or ``n``), the row count under each group."""
    names = [c for c in tab.columns if not c.startswith("ratio_") and c != "n"]
    labels = [" / ".join(map(str, k)) if isinstance(k, tuple) else str(k) for k in tab.index]
    x = np.arange(len(tab))
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(1.3 * len(tab) + 3, 3.6))
    for i, n in enumerate(names):
        ax.bar(x + (i - (len(names) - 1) / 2) * width, tab[n], width, label=n)
    ax.set_xticks(x, [f"{lab}\n(n={n})" for lab, n in zip(labels, tab["n"])], fontsize=8)
    ax.set(ylabel="MAPE (%)", title=title)
    ax.legend(fontsize=7, ncols=min(len(names), 5))
    fig.tight_layout()
    return fig


def predicted_vs_measured(frame: pd.DataFrame, names, by: str, title: str):
    """Predicted against measured latency (ms, log-log), one panel per predictor in ``names``
    (``frame`` has ``latency_ms`` and ``pred_<name>``), coloured by ``by``; the diagonal and
    the +-2x lines for reference."""
    fig, axes = plt.subplots(1, len(names), figsize=(3.8 * len(names), 3.6), squeeze=False)
    lo = max(frame["latency_ms"].min() / 2, 1e-4)
    hi = frame["latency_ms"].max() * 2
    for ax, n in zip(axes[0], names):
        for g, sub in frame.groupby(by, sort=False):
            ax.scatter(sub["latency_ms"], sub[f"pred_{n}"], s=5, alpha=0.5, label=str(g))
        for f, style in ((1, "k-"), (2, "k:"), (0.5, "k:")):
            ax.plot([lo, hi], [lo * f, hi * f], style, lw=0.7)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), title=n,
               xlabel="measured (ms)", ylabel="predicted from the datasheet (ms)")
    axes[0][0].legend(fontsize=7, markerscale=2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def step_bars(rows: pd.DataFrame, names, title: str):
    """Measured step time beside each predictor's forecast, one group of bars per step
    (``rows``: ``tag, latency_ms`` and ``pred_<name>``)."""
    x = np.arange(len(rows))
    cols = ["latency_ms"] + [f"pred_{n}" for n in names]
    width = 0.8 / len(cols)
    fig, ax = plt.subplots(figsize=(0.9 * len(rows) + 3, 4))
    for i, c in enumerate(cols):
        ax.bar(x + (i - (len(cols) - 1) / 2) * width, rows[c], width,
               label="measured" if c == "latency_ms" else c.removeprefix("pred_"),
               color="k" if c == "latency_ms" else None)
    ax.set_xticks(x, rows["tag"], rotation=60, ha="right", fontsize=7)
    ax.set(yscale="log", ylabel="step time (ms)", title=title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


__all__ = ["error_bars", "predicted_vs_measured", "step_bars"]
