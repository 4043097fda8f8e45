"""The explorer's figure: a scenario (:func:`nslib.explore.whatif.scenario`) in four panels.

Step time per GPU ("does not fit" instead of a time where the step does not fit in memory),
ms per kernel class, the largest kernels under each GPU's roofline, and the peak memory per GPU
against its capacity.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.explore.gpus import short_name
from nslib.explore.memory import MEMORY_PARTS

# figure size, inches: fixed width, a base height plus one row per GPU (at least MIN_ROWS)
FIG_WIDTH_IN = 20
FIG_BASE_HEIGHT_IN = 2.0
ROW_HEIGHT_IN = 0.55
MIN_ROWS = 3
PANEL_WIDTHS = [1, 1.2, 1.3, 1]
# fixed margins, inches: room for the class legend below and the title above
BOTTOM_MARGIN_IN = 1.1
TOP_MARGIN_IN = 0.65
LABEL_FONT, TITLE_FONT, SUPTITLE_FONT = 8, 10, 11
# room to the right of the longest bar (fraction of the axis): for its value label
TIME_HEADROOM, CLASS_HEADROOM, MEMORY_HEADROOM = 1.25, 1.05, 1.3
# the roofline panel's x range: the kernels' intensities padded by this factor each way,
# from at most MIN_INTENSITY to at least MAX_INTENSITY (FLOP/byte), drawn with ROOF_POINTS
INTENSITY_PAD = 4
MIN_INTENSITY, MAX_INTENSITY = 1e-2, 1e3
ROOF_POINTS = 200
# marker area (points^2) of a kernel: a base plus its share of the step
MARKER_BASE, MARKER_PER_SHARE = 12, 120
CAPACITY_MARKER_SIZE = 400
LEGEND_COLUMNS = 8
MISSING = "firebrick"   # the colour of "does not fit"


def _time_panel(ax, summary: pd.DataFrame, gcol: dict, fits: np.ndarray) -> None:
    """Forward (and hatched backward) ms per GPU; "does not fit" where the step does not."""
    n, y = len(summary), np.arange(len(summary))
    shown = summary.assign(fw_ms=np.where(fits, summary["fw_ms"], 0.0),
                           bw_ms=np.where(fits, summary["bw_ms"], 0.0))
    ax.barh(y, shown["fw_ms"], color=[gcol[g] for g in summary["gpu"]], label="forward")
    if (summary["bw_ms"] > 0).any():
        ax.barh(y, shown["bw_ms"], left=shown["fw_ms"], color=[gcol[g] for g in summary["gpu"]],
                alpha=0.5, hatch="//", label="backward")
    lo = summary.get("interval_lo_ms", pd.Series(np.nan, index=summary.index)).to_numpy(float)
    hi = summary.get("interval_hi_ms", pd.Series(np.nan, index=summary.index)).to_numpy(float)
    band = fits & np.isfinite(lo) & np.isfinite(hi)
    if band.any():  # the calibrated interval (nslib calibrate), where there is one
        ax.hlines(y[band], lo[band], hi[band], color="k", lw=1.2, label="calibrated interval")
    at = np.where(band, np.fmax(summary["e2e_ms"].to_numpy(float), hi), summary["e2e_ms"])
    for yi, v, x, ok in zip(y, summary["e2e_ms"], at, fits):
        ax.text(x if ok else 0, yi, f" {v:,.1f}" if ok else " does not fit in memory",
                va="center", fontsize=LABEL_FONT, color="k" if ok else MISSING)
    ax.set_yticks(y, [short_name(g) for g in summary["gpu"]], fontsize=LABEL_FONT)
    ax.invert_yaxis()
    ax.set_xlabel("predicted step time (ms)")
    top = np.nanmax(np.r_[summary["e2e_ms"].to_numpy(float), hi[band]]) if n else 1.0
    ax.set_xlim(0, top * TIME_HEADROOM)
    ax.set_title("step time per GPU" + (" (hatched: backward)" if (summary["bw_ms"] > 0).any()
                                        else ""), fontsize=TITLE_FONT)


def _class_panel(fig, ax, summary: pd.DataFrame, pc: pd.DataFrame, fits: np.ndarray) -> None:
    """Stacked ms per kernel class per GPU, with the class legend below the figure."""
    import matplotlib.pyplot as plt

    n, y = len(summary), np.arange(len(summary))
    left = np.zeros(n)
    cmap = plt.get_cmap("tab10")
    for i, c in enumerate(pc.columns):
        vals = np.where(fits, pc[c].reindex(summary["gpu"]).fillna(0).to_numpy(float), 0.0)
        ax.barh(y, vals, left=left, color=cmap(i % 10), label=c)
        left += vals
    ax.set_yticks(y, [""] * n)
    ax.invert_yaxis()
    ax.set_xlabel("predicted ms per kernel class")
    ax.set_xlim(0, left.max() * CLASS_HEADROOM if n else 1)
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", bbox_to_anchor=(0.5, 0.0), fontsize=LABEL_FONT,
               ncol=min(LEGEND_COLUMNS, len(names)), frameon=False, title="kernel class",
               title_fontsize=LABEL_FONT)
    ax.set_title("where the time goes", fontsize=TITLE_FONT)


def _roofline_panel(ax, result: dict, gcol: dict) -> None:
    """The largest kernels (size: share of the step) under each GPU's roofline."""
    summary, top = result["summary"], result["top_kernels"]
    pts = top[(top["flops"] > 0) & np.isfinite(top["intensity"])]
    if len(pts):
        lo = max(pts["intensity"].min() / INTENSITY_PAD, MIN_INTENSITY)
        hi = max(pts["intensity"].max() * INTENSITY_PAD, MAX_INTENSITY)
        xs = np.logspace(np.log10(lo), np.log10(hi), ROOF_POINTS)
        half = result.get("params", {}).get("dtype", "fp32") != "fp32"
        for spec, label in zip(result["gpus"], summary["gpu"]):
            # 16 bits: GEMMs and attention run under the tensor-core roof (dashed: FP32 roof)
            roofs = [(spec.bf16_gflops, "-"), (spec.peak_gflops, ":")] if half else [
                (spec.peak_gflops, "-")]
            for peak, style in roofs:
                ax.plot(xs, np.minimum(peak, xs * spec.mem_bw), style, color=gcol[label], lw=1)
            sub = pts[pts["gpu"] == label]
            ax.scatter(sub["intensity"], sub["achieved_gflops"],
                       s=MARKER_BASE + MARKER_PER_SHARE * sub["share"],
                       color=gcol[label], alpha=0.7, edgecolor="k", linewidth=0.3)
        ax.set(xscale="log", yscale="log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved GFLOP/s (predicted)")
    ax.set_title("largest kernels under each roofline (size: share of step)", fontsize=TITLE_FONT)


def _memory_panel(ax, mem: pd.DataFrame) -> None:
    """Stacked peak-memory bars per GPU (GB) with each GPU's capacity as a black tick."""
    import matplotlib.pyplot as plt

    y = np.arange(len(mem))
    left = np.zeros(len(mem))
    cmap = plt.get_cmap("Set2")
    for i, part in enumerate(MEMORY_PARTS):
        vals = mem[part].to_numpy(float)
        if (vals > 0).any():
            ax.barh(y, vals, left=left, color=cmap(i % 8), label=part)
            left += vals
    ax.scatter(mem["capacity"], y, marker="|", s=CAPACITY_MARKER_SIZE, color="k",
               label="GPU memory", zorder=3)
    for yi, total, ok in zip(y, mem["total"], mem["fits"]):
        ax.text(total, yi, f" {total:,.1f}" + ("" if ok else " (does not fit)"), va="center",
                fontsize=LABEL_FONT, color="k" if ok else MISSING)
    ax.set_yticks(y, [""] * len(y))
    ax.invert_yaxis()
    ax.set_xlim(0, max(mem["total"].max(), mem["capacity"].max()) * MEMORY_HEADROOM
                if len(mem) else 1)
    ax.set_xlabel("peak memory per GPU (GB)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=4,
              frameon=False, columnspacing=0.8, handlelength=1.2)
    ax.set_title("will it fit? (tick: the GPU's memory)", fontsize=TITLE_FONT)


def plot_scenario(result: dict, title: str | None = None):
    """Four panels: step time per GPU ("does not fit" instead of a time where the step does
    not fit in memory), ms per kernel class, the largest kernels' roofline, peak memory."""
    import matplotlib.pyplot as plt

    summary, n = result["summary"], len(result["summary"])
    fig, axes = plt.subplots(1, 4, figsize=(FIG_WIDTH_IN, FIG_BASE_HEIGHT_IN + ROW_HEIGHT_IN
                                            * max(n, MIN_ROWS)),
                             gridspec_kw={"width_ratios": PANEL_WIDTHS})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    gcol = {g: colors[i % len(colors)] for i, g in enumerate(summary["gpu"])}
    fits = summary["fits"].to_numpy(bool) if "fits" in summary else np.ones(n, bool)
    _time_panel(axes[0], summary, gcol, fits)
    _class_panel(fig, axes[1], summary, result["per_class"], fits)
    _roofline_panel(axes[2], result, gcol)
    if "memory" in result:
        _memory_panel(axes[3], result["memory"].reindex(summary["gpu"]))
    else:
        axes[3].set_axis_off()
    p = result.get("params", {})
    fig.suptitle(title or f"{p.get('model')} {p.get('mode')} batch {p.get('batch')} seq "
                 f"{p.get('seq')} ({p.get('predictor')}, {p.get('dtype', 'fp32')})",
                 fontsize=SUPTITLE_FONT)
    # fixed margins: tight_layout would draw the figure once more (slow in the explorer)
    h = fig.get_figheight()
    fig.subplots_adjust(left=0.12, right=0.985, wspace=0.25, bottom=BOTTOM_MARGIN_IN / h,
                        top=1 - TOP_MARGIN_IN / h)
    return fig


__all__ = ["plot_scenario"]
