"""Figures of the serving forecasts (notebook 12, the explorer's serving view)."""
from __future__ import annotations

import matplotlib.pyplot as plt

import pandas as pd


def serving_scatter(pred: pd.DataFrame, methods=("nslib", "roofline")):
    """Predicted against measured TTFT and TPOT (ms, log-log), one panel per method and
    metric, one colour per engine, with y = x and +-20% lines."""
    fig, axes = plt.subplots(len(methods), 2, figsize=(9, 4.2 * len(methods)), squeeze=False)
    engines = sorted(pred["framework"].unique())
    colours = dict(zip(engines, plt.cm.tab10.colors))
    for r, m in enumerate(methods):
        for c, what in enumerate(("ttft", "tpot")):
            ax = axes[r, c]
            y, p = pred[f"silicon_{what}_ms"], pred[f"{m}_{what}_ms"]
            for fw in engines:
                sel = pred["framework"] == fw
                ax.scatter(y[sel], p[sel], s=10, alpha=0.6, color=colours[fw], label=fw)
            lo, hi = float(min(y.min(), p.min())), float(max(y.max(), p.max()))
            for f, style in ((1.0, "-"), (1.2, ":"), (1 / 1.2, ":")):
                ax.plot([lo, hi], [lo * f, hi * f], "k" + style, lw=0.8)
            ax.set(xscale="log", yscale="log", title=f"{m}: {what.upper()}",
                   xlabel="measured (ms)", ylabel="predicted (ms)")
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def error_by(pred: pd.DataFrame, column: str = "batch_size", method: str = "nslib"):
    """TTFT and TPOT MAPE (%) of ``method`` against ``column`` (e.g. the concurrency), one
    line per engine."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, what in zip(axes, ("ttft", "tpot")):
        ape = 100 * (pred[f"{method}_{what}_ms"] / pred[f"silicon_{what}_ms"] - 1).abs()
        tab = pred.assign(ape=ape).pivot_table(index=column, columns="framework", values="ape",
                                               aggfunc="mean")
        for fw in tab.columns:   # an engine measured at fewer points keeps one line
            ax.plot(tab[fw].dropna().index, tab[fw].dropna(), marker="o", label=fw)
        name = "concurrency" if column == "batch_size" else column
        ax.set(xscale="log", xlabel=name, ylabel=f"{what.upper()} MAPE (%)",
               title=f"{method}: {what.upper()} error by {name}")
        ax.legend(fontsize=7)
        ax.set_xticks(tab.index, [str(int(v)) for v in tab.index])
    fig.tight_layout()
    return fig


def throughput_curves(frame: pd.DataFrame):
    """Output tokens/s per GPU and TTFT (ms) against concurrency, one line per GPU
    (``frame``: rows of :func:`nslib.model.serving.serving_forecast` with a ``gpu``
    column); a faint band under each TTFT line from the lone-arrival to the burst TTFT
    (how far the arrival pattern alone moves it) when the frame has them."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for gpu, g in frame.groupby("gpu", sort=False):
        axes[0].plot(g["concurrency"], g["tokens_per_s_gpu"], marker=".", label=gpu)
        line, = axes[1].plot(g["concurrency"], g["ttft_ms"], marker=".", label=gpu)
        if "ttft_lone_ms" in g:
            axes[1].fill_between(g["concurrency"], g["ttft_lone_ms"], g["ttft_burst_ms"],
                                 color=line.get_color(), alpha=0.12, linewidth=0)
    axes[0].set(xscale="log", xlabel="concurrency (requests in flight)",
                ylabel="output tokens/s per GPU")
    axes[1].set(xscale="log", yscale="log", xlabel="concurrency (requests in flight)",
                ylabel="TTFT (ms)", title="band: requests arriving alone .. all at once")
    axes[0].legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


__all__ = ["error_by", "serving_scatter", "throughput_curves"]

