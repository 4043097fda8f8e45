# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 11 · The paper side by side: reported, reproduced, nslib
#
# The NeuSight paper (Lee, Phanishayee, Mahajan, ASPLOS 2025) reports its results as tables;
# they ship with its data (`summary/` of the NeuSight folder). This notebook puts each
# configuration the paper reports beside what nslib gets on the same label:
#
# - **reported**: the paper's number (its NeuSight, Roofline, Habitat and Li et al.);
# - **NeuSight reproduced** (`neusight`): the paper's method as published, trained here on the
#   same training GPUs (its features, wave law, published network settings, tile lookup and
#   plain-sum aggregation; `nslib.predictors.neusight`);
# - **nslib** (`nslib`): nslib's own design (physical kernel laws, split-K, dispatch floors),
#   which the paper never ran; why it differs: `docs/decisions.md`;
# - **baselines reproduced**: Roofline, Habitat and Li et al. as nslib implements them.
#
# Every number below is computed from the data and the summary files; the readings at the end
# are generated from the measured per-class gaps.

# %% tags=["parameters"]
data = None        # NeuSight data root; None: $NSLIB_DATA or datasets/neusight
out = None         # folder for figures and tables; None: figures/interactive/ (make reproduce: figures/)
predictors = ["neusight", "nslib", "roofline", "habitat", "li"]
models = None      # model names; None: every model the labels hold
seed = 0
quick = False      # quick profile: quick-trained predictors, BERT only

# %%
import pandas as pd

from nslib.data import paper_results
from nslib.data.gpus import load_gpus
from nslib.evaluation import reported as rep
from nslib.data.settings import Settings
from nslib.evaluation.model_level import evaluate_models, evaluate_variant
from nslib.evaluation.original_graph import evaluate_graphs
from nslib.evaluation.per_class import per_class_results, per_class_table
from nslib.predictors import available
from nslib.viz.figures import save_figure, save_table
from nslib.viz.scratch import notebook_out
from nslib.viz.reported_plots import reported_bars

out = notebook_out(out)   # run by hand: figures/interactive/, never the tracked figures/
settings = Settings(data=data, quick=quick, seed=seed)  # made once, passed down

prefix = "11"
names = [p for p in predictors if p in available()]
if quick and models is None:
    models = ["bert_large"]
gpu_names = {k: g.name for k, g in load_gpus(data).items()}

# %% [markdown]
# ## What the paper reports
# One row per configuration and method of `summary.csv` (the per-GPU bar charts, the fusion
# and the distributed tables are the same rows pivoted; `tests/test_paper_results.py` checks
# that they agree).

# %%
reported = paper_results.reported_configs(data)
if models:
    reported = reported[reported["model"].isin(models)]
reported.pivot_table(index=["mode", "variant"], columns="gpu_key", values="measured_ms",
                     aggfunc="size")

# %% [markdown]
# ## The same labels, reproduced
# Single-GPU inference and training under the paper's protocol, the fused labels and the
# 4-GPU DP/TP/PP labels, each priced by every predictor.

# %%
parts = [evaluate_models(mode, names, models=models, settings=settings)
         for mode in ("inf", "train")]
parts += [evaluate_variant(kind, names, models=models, settings=settings)
          for kind in ("fusion", "distributed")]
results = pd.concat([p for p in parts if len(p)], ignore_index=True)
side = rep.side_by_side(reported, results)
save_table(side.set_index(paper_results.KEYS + ["method"]), f"{prefix}_configs", out, digits=2)
missing = side[side["reported_err"].notna() & side["reproduced_err"].isna()]
print(f"{len(side)} (configuration, method) rows; reported without a label here: "
      f"{missing[paper_results.KEYS].drop_duplicates().shape[0]} configurations")

# %% [markdown]
# ## Per GPU: the paper's bar charts
# Mean error over the configurations the paper reports for each GPU, inference and training
# (single GPU, no fusion). `reported` is the paper's number, `reproduced` nslib's on the same
# configurations; `nslib` is averaged over the same configurations.

# %%
single = side[side["variant"] == ""]
means = rep.gpu_means(single, names)
cells = rep.agreement(means, "neusight") if "neusight" in names else pd.DataFrame()
headline = pd.DataFrame({
    "paper NeuSight": means[("neusight", "reported")] if "neusight" in names else None,
    "NeuSight reproduced": means[("neusight", "reproduced")] if "neusight" in names else None,
    "nslib": means[("nslib", "reproduced")] if "nslib" in names else None,
    **{f"{lab} {kind}": means[(m, kind)] for m, lab in (("roofline", "Roofline"),
                                                          ("habitat", "Habitat"),
                                                          ("li", "Li et al."))
       if m in names for kind in ("reported", "reproduced")},
    "configs": means[(names[0], "n")]}).dropna(axis=1, how="all")
headline.index = [f"{gpu_names.get(g, g)} ({m})" for g, m in headline.index]
save_table(headline, f"{prefix}_reported_vs_reproduced", out)
headline.round(1)

# %%
reported_keys = single.dropna(subset=["reported_err"])[paper_results.KEYS].drop_duplicates()
for mode in ("inf", "train"):
    # the configurations the paper reports (the data labels a few more)
    sub = single[single["mode"] == mode].merge(reported_keys, on=paper_results.KEYS)
    if len(sub):
        fig = reported_bars(sub, gpu_names, title=f"{'Inference' if mode == 'inf' else 'Training'}"
                            ": error per configuration (bars reproduced here, black marks the "
                            "paper's reported value)")
        save_figure(fig, f"{prefix}_{mode}_bars", out)

# %% [markdown]
# ## How close is the reproduction of NeuSight?
# A (GPU, mode) cell agrees when the reproduced mean is within 5 points of the reported one.

# %%
if len(cells):
    save_table(cells.assign(agrees=cells["agrees"].astype(int)), f"{prefix}_agreement", out)
    print(f"{int(cells['agrees'].sum())} of {len(cells)} (GPU, mode) cells within "
          f"{rep.TOLERANCE:g} points of the paper's NeuSight")
cells

# %% [markdown]
# ## The paper's method on the original tool's own graphs
# The NeuSight data ships the operator graph its tool parsed for every configuration it
# evaluated: each node's forward, backward and gradient-accumulation kernels, its backward as
# the original tool decomposed it (`nslib.evaluation.original_graph`). Pricing those graphs
# with the same reproduced predictor and the plain sum takes nslib's trace out of the
# comparison: where the two reproductions agree, the gap to the paper's numbers lies in the
# predictor, not in the trace.

# %%
on_graphs, graph_cells = pd.DataFrame(), None
if "neusight" in names:
    graphs = pd.concat([evaluate_graphs(mode, "neusight", models=models, settings=settings)
                        for mode in ("inf", "train")], ignore_index=True)
    on = graphs["predictor"].iloc[0]
    gmeans = rep.gpu_means(rep.side_by_side(reported, graphs[graphs["note"] == ""]), [on])
    graph_cells = gmeans[(on, "reproduced")]   # per (GPU, mode), for the readings below
    on_graphs = pd.DataFrame({
        "paper NeuSight": means[("neusight", "reported")],
        "reproduced, nslib's trace": means[("neusight", "reproduced")],
        "reproduced, original graphs": graph_cells}).dropna()
    on_graphs["moved"] = (on_graphs["reproduced, original graphs"]
                          - on_graphs["reproduced, nslib's trace"])
    on_graphs.index = [f"{gpu_names.get(g, g)} ({m})" for g, m in on_graphs.index]
    save_table(on_graphs, f"{prefix}_original_graphs", out)
    close = (on_graphs["reproduced, original graphs"] - on_graphs["paper NeuSight"]).abs() \
        <= rep.TOLERANCE
    print(f"On the original graphs the cells move by at most "
          f"{on_graphs['moved'].abs().max():.1f} points; {int(close.sum())} of {len(close)} "
          f"within {rep.TOLERANCE:g} points of the paper's NeuSight. Labels without a graph: "
          f"{graphs.loc[graphs['note'] != '', 'tag'].nunique()}.")
on_graphs.round(1)

# %% [markdown]
# ## Per kernel class, in and out of distribution
# The paper's `perop.csv` beside the same classes reproduced: each model's operators priced
# against the label CSVs' per-operator times (`nslib.evaluation.per_class`), inference and
# training labels together, out of distribution meaning a new GPU or a new model.

# %%
single_results = results[results["variant"].fillna("") == ""]
rows, node_frames = [], {}
for name in names:
    pc = pd.concat([per_class_results(single_results[single_results["mode"] == m], name,
                                      settings=settings)
                    for m in ("inf", "train") if (single_results["mode"] == m).any()])
    node_frames[name] = pc
    tab = per_class_table(pc)
    for dist in tab.columns:
        for cls, v in tab[dist].items():
            rows.append({"method": name, "dist": dist, "cls": cls, "reproduced": v})
ours = pd.DataFrame(rows)
theirs = paper_results.reported_per_class(data).rename(columns={"err": "reported"})
per_class = theirs.merge(ours, on=["method", "dist", "cls"], how="outer")
per_class = per_class.pivot_table(index=["dist", "cls"], columns="method",
                                  values=["reported", "reproduced"]).swaplevel(0, 1, axis=1)
per_class = per_class.sort_index(axis=1)
save_table(per_class, f"{prefix}_per_class", out)
for line in rep.per_class_readings(per_class):
    print("-", line)
per_class.round(1)

# %% [markdown]
# The same operators GPU by GPU: the reproduced NeuSight's prediction over the label CSVs'
# time, summed per GPU, mode and class (the node-by-node reading the cells below use).

# %%
nodes = rep.node_ratios(node_frames["neusight"]) if "neusight" in node_frames else None
if nodes is not None:
    save_table(nodes, f"{prefix}_node_ratios", out, digits=2)
    display(nodes["ratio"].unstack("cls").round(2))

# %% [markdown]
# ## Where the cells further off differ: class by class
# The summary also splits each configuration's prediction by class, filing each node's
# forward and backward time under the node's operator. The reproduced NeuSight is split the
# same way (each kernel under the operator that launched it, memory and host operators as
# `other`); how much of the gap the trace accounts for (the original graphs above), the class
# that carries most of the gap, how each reproduction's prediction of it compares with the
# label's time for that class, and how the reproduction prices that class node by node on the
# same GPU (table above) are the measured reading of each cell.

# %%
readings = []
if "neusight" in names and len(cells):
    off = cells[~cells["agrees"]].index
    configs = single[(single["method"] == "neusight") & single["reproduced_ms"].notna() &
                     single["reported_ms"].notna()]
    configs = configs[pd.MultiIndex.from_frame(configs[["gpu_key", "mode"]]).isin(off)]
    split = rep.operator_split(configs, "neusight", data=data, quick=quick)
    gaps = rep.class_gaps(paper_results.reported_class_ms(data), rep.class_frame(configs, split))
    shares = rep.gap_shares(gaps)
    save_table(shares, f"{prefix}_class_gaps", out, digits=2)
    readings = rep.readings(cells, shares, gpu_names, nodes, graph_cells)
    display(shares.round(2))
for line in readings:
    print("-", line)

# %% [markdown]
# ## Fusion and 4-GPU DP / TP / PP
# Configuration by configuration (measured, then each method's error; the paper's fusion and
# distributed tables show its NeuSight only). A configuration further than 5 points from the
# report is read against the plain single-GPU configuration of the same GPU, model and batch:
# when that one is off the same way, the gap is inherited from the single-GPU prediction.

# %%
for kind, sel in (("fusion", side["variant"] == "fusion"),
                  ("distributed", side["variant"].isin(["dp4", "tp4", "pp4_1"]))):
    sub = side[sel]
    if not len(sub):
        continue
    tab = sub.pivot_table(index=["gpu_key", "model", "batch", "variant"], columns="method",
                          values=["reported_err", "reproduced_err"])
    tab.insert(0, "measured ms", sub.groupby(["gpu_key", "model", "batch", "variant"])
               ["measured_ms"].first())
    save_table(tab, f"{prefix}_{kind}", out)
    display(tab.round(1))
for line in rep.variant_readings(side, gpu_names=gpu_names):
    print("-", line)
