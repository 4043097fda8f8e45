"""The paper's per-GPU error bar charts, redrawn with the reproduction beside the report."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

# methods in the paper's order, nslib's design last
ORDER = ["roofline", "habitat", "li", "neusight", "nslib"]
LABELS = {"roofline": "Roofline", "habitat": "Habitat", "li": "Li et al.",
          "neusight": "NeuSight", "nslib": "nslib"}
FLOOR = 0.1  # % : errors are drawn on a log axis, so an exact hit shows at this height


def reported_bars(side: pd.DataFrame, gpu_names: dict | None = None, title: str = ""):
    """One panel per GPU: bars of each method's reproduced error (%) per configuration
    (model and batch), and the paper's reported error of the same method as a black mark on
    its bar. ``side``: :func:`nslib.evaluation.reported.side_by_side` rows of one mode."""
    names = gpu_names or {}
    gpus = sorted(side["gpu_key"].unique())
    methods = [m for m in ORDER if m in set(side["method"])] + \
        sorted(set(side["method"]) - set(ORDER))
    fig, axes = plt.subplots(len(gpus), 1, figsize=(11, 2.6 * len(gpus) + 0.6), squeeze=False)
    width = 0.8 / len(methods)
    for ax, gpu in zip(axes[:, 0], gpus):
        sub = side[side["gpu_key"] == gpu]
        configs = sub[["model", "seq", "batch"]].drop_duplicates().sort_values(
            ["model", "seq", "batch"])
        several = configs.groupby("model")["seq"].transform("nunique") > 1
        labels = [f"{m}{f' s{s}' if many else ''} b{b}" for (m, s, b), many in
                  zip(configs.itertuples(index=False), several)]
        x = np.arange(len(labels))
        for j, m in enumerate(methods):
            cell = configs.merge(sub[sub["method"] == m], on=["model", "seq", "batch"],
                                 how="left")
            pos = x - 0.4 + width * (j + 0.5)
            ax.bar(pos, np.maximum(cell["reproduced_err"].to_numpy(float), FLOOR), width,
                   label=LABELS.get(m, m), color=f"C{j}")
            ax.scatter(pos, np.maximum(cell["reported_err"].to_numpy(float), FLOOR),
                       marker="_", s=90, color="k", zorder=5,
                       label="reported" if j == 0 else None)
        ax.set_yscale("log")
        ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("error (%)")
        ax.set_title(names.get(gpu, gpu), fontsize=10)
    handles, labs = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labs, loc="upper center", ncol=len(labs), fontsize=8,
               bbox_to_anchor=(0.5, 1.0))
    fig.suptitle(title, y=1.03, fontsize=10)
    fig.tight_layout()
    return fig
