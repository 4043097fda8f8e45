"""Figures of the fused and multi-GPU evaluations (notebooks 06 and 07): predicted against
measured latency per configuration, the speed-up from fusion, the parallel what-if."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

PANEL_HEIGHT = 3.8   # inches
BAR_WIDTH = 0.8      # of a configuration's slot
TICK_ROTATION = 45   # degrees, configuration labels
SMALL_FONT = 8       # points, tick labels and legends


def config_labels(frame: pd.DataFrame, *cols: str) -> pd.Series:
    """One label per row: the GPU name without its vendor, a line break, then ``cols``
    joined by spaces (``"A100-SXM4-40GB\\ngpt2_large b4 dp4"``)."""
    label = frame["gpu"].str.replace("NVIDIA ", "") + "\n" + frame[cols[0]]
    for col in cols[1:]:
        label = label + " " + frame[col]
    return label


def _per_label(frame: pd.DataFrame, values: str, measured: str):
    """``values`` per label (rows) and predictor (columns), and the label's ``measured``."""
    piv = frame.pivot_table(index="label", columns="predictor", values=values)
    meas = frame.drop_duplicates("label").set_index("label")[measured].reindex(piv.index)
    return piv, meas


def _bars_with_measured(ax, piv: pd.DataFrame, meas: pd.Series, ylabel: str):
    """Bars of ``piv`` (ms per label and predictor) with ``meas`` (ms per label) as black
    ticks, log scale."""
    piv.plot.bar(ax=ax, width=BAR_WIDTH)
    ax.scatter(range(len(meas)), meas.to_numpy(), color="k", marker="_", s=500, zorder=5,
               label="measured")
    ax.set(ylabel=ylabel, xlabel="", yscale="log")
    ax.tick_params(axis="x", rotation=TICK_ROTATION, labelsize=SMALL_FONT)
    ax.legend(fontsize=SMALL_FONT)


def fusion_bars(speedups: pd.DataFrame):
    """Left: predicted fused ms per configuration and predictor, measured as black ticks;
    right: predicted and measured speed-up from fusion (x). ``speedups``:
    :func:`nslib.evaluation.fusion_eval.fusion_speedups`."""
    sp = speedups.assign(label=config_labels(speedups, "config"))
    fig, axes = plt.subplots(1, 2, figsize=(12, PANEL_HEIGHT))
    _bars_with_measured(axes[0], *_per_label(sp, "pred_ms", "e2e_ms"),
                        "fused latency (ms); black: measured")
    spp, meas = _per_label(sp, "predicted", "measured")
    spp["measured"] = meas
    spp.plot.bar(ax=axes[1], width=BAR_WIDTH)
    axes[1].axhline(1.0, color="grey", lw=0.8)
    axes[1].set(ylabel="speed-up from fusion (x)", xlabel="", ylim=(0.9, None))
    axes[1].tick_params(axis="x", rotation=TICK_ROTATION, labelsize=SMALL_FONT)
    fig.tight_layout()
    return fig


def parallel_bars(results: pd.DataFrame):
    """Predicted step ms per (GPU, config, strategy) and predictor, measured as black ticks.
    ``results``: :func:`nslib.evaluation.parallel_eval.with_strategy` applied."""
    plot = results.assign(label=config_labels(results, "config", "strategy"))
    piv, meas = _per_label(plot, "pred_ms", "e2e_ms")
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(piv)), PANEL_HEIGHT))
    _bars_with_measured(ax, piv, meas, "step time (ms); black: measured")
    return fig


def _degree_panel(ax, whatif: pd.DataFrame, degrees, default_gbps: float, title: str):
    """Step ms against the degree on the default link, one line per strategy, with the ideal
    1 / n scaling of DP's one-GPU step."""
    base = whatif[whatif["link_gbps"] == default_gbps].drop_duplicates(["strategy", "degree"])
    for kind, g in base.groupby("strategy"):
        ax.plot(g["degree"], g["step_ms"], marker="o", label=kind.upper())
    one = base[(base["strategy"] == "dp") & (base["degree"] == 1)]["step_ms"]
    if len(one):
        ax.plot(degrees, float(one.iloc[0]) / np.asarray(degrees, float), color="grey",
                lw=0.8, ls=":", label="ideal (1 / n)")
    ax.set(xscale="log", yscale="log", xlabel="GPUs (degree)", ylabel="step time (ms)",
           title=title)
    ax.set_xticks(degrees, [str(d) for d in degrees])
    ax.xaxis.set_minor_formatter(NullFormatter())


def _link_panel(ax, whatif: pd.DataFrame, degree: int, default_gbps: float):
    """Step ms against the link bandwidth at ``degree``, one line per strategy, with the
    default link dashed."""
    sweep = whatif[whatif["degree"] == degree].drop_duplicates(["strategy", "link_gbps"])
    for kind, g in sweep.groupby("strategy"):
        g = g.sort_values("link_gbps")
        ax.plot(g["link_gbps"], g["step_ms"], marker="o", label=kind.upper())
    ax.axvline(default_gbps, color="grey", lw=0.8, ls="--")
    ax.set(xscale="log", xlabel="link bandwidth (GB/s, datasheet)", ylabel="step time (ms)",
           title=f"degree {degree}")


def whatif_lines(whatif: pd.DataFrame, degrees, link_degree: int, default_gbps: float,
                 title: str):
    """Left: step ms against ``degrees`` on the default link (``default_gbps``, datasheet
    GB/s), titled ``title``; right: against the link bandwidth at ``link_degree``.
    ``whatif``: :func:`nslib.explore.parallel.parallel_whatif`."""
    fig, axes = plt.subplots(1, 2, figsize=(11, PANEL_HEIGHT))
    _degree_panel(axes[0], whatif, degrees, default_gbps, title)
    _link_panel(axes[1], whatif, link_degree, default_gbps)
    for ax in axes:
        ax.legend(fontsize=SMALL_FONT)
    fig.tight_layout()
    return fig
