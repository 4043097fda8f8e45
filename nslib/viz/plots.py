"""Figures that more than one notebook draws (model-level tables)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns


def pred_vs_measured_bars(results: pd.DataFrame):
    """Bars of predicted ms per configuration and predictor, one panel per GPU, with the
    measured ms as black ticks (log scale). ``results``:
    nslib.evaluation.model_level.evaluate_models."""
    plot = results.assign(label=results["config"])
    order = sorted(plot["label"].unique())
    g = sns.catplot(data=plot, x="label", y="pred_ms", hue="predictor", col="gpu", kind="bar",
                    order=order, col_wrap=2, height=3.2, aspect=1.8, sharey=False)
    for ax, gpu in zip(g.axes.flat, g.col_names):
        meas = plot[plot["gpu"] == gpu].drop_duplicates("label")
        ax.scatter([order.index(lb) for lb in meas["label"]], meas["e2e_ms"], color="k",
                   marker="_", s=400, zorder=5, label="measured")
        ax.set_yscale("log")
        ax.tick_params(axis="x", rotation=45)
    g.set_axis_labels("", "latency (ms); black: measured")
    return g.figure


def share_bars(breakdown: pd.DataFrame, xlabel: str):
    """Horizontal stacked bars of each row's shares (percent) of its total."""
    share = breakdown.div(breakdown.sum(axis=1), axis=0) * 100
    ax = share.plot.barh(stacked=True, figsize=(8, 0.4 * len(share) + 1.5))
    ax.set(xlabel=xlabel, ylabel="")
    ax.legend(bbox_to_anchor=(1, 1))
    return ax.figure


def logo_heatmap(tab, title: str = "leave-one-GPU-out MAPE (%)"):
    """Heatmap of a :func:`nslib.evaluation.kernel_level.logo_table`: classes x GPUs, summary columns last."""
    fig, ax = plt.subplots(figsize=(1.1 * tab.shape[1] + 2, 0.5 * tab.shape[0] + 1.5))
    sns.heatmap(tab.astype(float), annot=True, fmt=".0f", cmap="rocket_r", vmin=0, vmax=60,
                cbar_kws={"label": "MAPE (%)"}, ax=ax)
    ax.set(title=title, xlabel="", ylabel="")
    ax.tick_params(axis="x", rotation=30)
    for lbl in ax.get_xticklabels():
        lbl.set_horizontalalignment("right")
    return fig


def pred_vs_measured_scatter(frame: pd.DataFrame, pred_col: str, hue: str = "gpu",
                             max_points: int = 3000, seed: int = 0):
    """Log-log scatter of ``pred_col`` against ``latency_ms`` (ms), one colour per ``hue``,
    with the y = x line and +-20% bands; at most ``max_points`` rows (a seeded sample)."""
    plot = frame.sample(min(len(frame), max_points), random_state=seed)
    fig, ax = plt.subplots(figsize=(5.5, 5))
    sns.scatterplot(data=plot, x="latency_ms", y=pred_col, hue=hue, s=8, alpha=0.5,
                    linewidth=0, ax=ax)
    lo = float(min(plot["latency_ms"].min(), plot[pred_col].min()))
    hi = float(max(plot["latency_ms"].max(), plot[pred_col].max()))
    for f, style in ((1.0, "-"), (1.2, ":"), (1 / 1.2, ":")):
        ax.plot([lo, hi], [lo * f, hi * f], "k" + style, lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="measured (ms)", ylabel="predicted (ms)")
    ax.legend(fontsize=7, markerscale=2)
    return fig
