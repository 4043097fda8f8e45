# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · Training-step latency of whole models
#
# Each model configuration is traced on the meta device into the kernels it launches
# (`nslib.graph`), every kernel is predicted, and the sum is compared with the measured
# latency in the label folder (mean of the 5 fastest of 25 runs). GPUs, models and batch sizes
# come from the labels, so a new GPU's labels join these tables without code changes.

# %% tags=["parameters"]
data = None        # NeuSight data root; None: $NSLIB_DATA or datasets/neusight
out = None         # folder for figures and tables; None: figures/
predictors = ["neusight", "roofline", "habitat", "li"]
gpus = None        # GPU file stems to evaluate; None: every GPU with labels
models = None      # model names; None: every labelled model
seed = 0
quick = False      # quick profile: quick-trained predictors, a subset of configurations

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from nslib.figures import save_figure, save_table
from nslib.model_eval import evaluate_models, paper_table, summary_table
from nslib.predictors import available

mode = "train"
prefix = "05_training"[:2]
names = [p for p in predictors if p in available()]
if quick and models is None:
    models = ["bert_large", "gpt2_large"]

# %%
results = evaluate_models(mode, names, data=data, gpus=gpus, models=models, quick=quick)
save_table(results.drop(columns=["note"]).set_index(["gpu", "config", "predictor"]),
           f"{prefix}_{mode}_results", out, digits=2)
problems = results[results["note"] != ""]
problems[["gpu", "tag", "predictor", "note"]]

# %% [markdown]
# ## The paper's table: percent error per GPU and configuration

# %%
table = paper_table(results)
save_table(table, f"{prefix}_{mode}_error_table", out)
table.T

# %% [markdown]
# ## Summary: mean error per GPU, in and out of distribution
# Out of distribution: a GPU absent from the kernel training data, or a model the original
# tool never saw (GPT3-XL, GPT3-2.7B, OPT-1.3B).

# %%
summary = summary_table(results)
save_table(summary, f"{prefix}_{mode}_summary", out)
summary

# %% [markdown]
# ## Per kernel class: in and out of distribution
# The label CSVs hold measured per-operator latencies of a one-layer graph; repeated over the
# layers and grouped by the class of each operator, they give the measured time per class
# (`other`: timed Python-level operators that launch no kernel, which no predictor models).

# %%
from nslib.class_eval import per_class_results, per_class_table
per_class = per_class_results(results, names[0], data=data, quick=quick)
class_table = per_class_table(per_class)
save_table(class_table, f"{prefix}_{mode}_per_class_error", out)
class_table

# %% [markdown]
# ## Predicted against measured milliseconds

# %%
plot = results.copy()
plot["label"] = plot["config"]
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
save_figure(g.figure, f"{prefix}_{mode}_pred_vs_measured", out)

# %% [markdown]
# ## Where the time goes
# NeuSight's predicted milliseconds per kernel class, one bar per model configuration (on the
# first GPU in the results).

# %%
from nslib.predict import predict_model
first = results["gpu_key"].iloc[0]
rows = []
for _, r in results[results["gpu_key"] == first].drop_duplicates("tag").iterrows():
    _, s = predict_model(first, r["model"], r["batch"], r["seq"], mode,
                         predictor=names[0], data=data, quick=quick)
    rows.append({"config": r["config"], **s["per_class_ms"]})
breakdown = pd.DataFrame(rows).set_index("config").fillna(0)
save_table(breakdown, f"{prefix}_{mode}_breakdown", out, digits=2)
ax = (breakdown.div(breakdown.sum(axis=1), axis=0) * 100).plot.barh(stacked=True,
                                                                    figsize=(8, 3.5))
ax.set(xlabel=f"share of predicted time on {first} (%)", ylabel="")
ax.legend(bbox_to_anchor=(1, 1))
save_figure(ax.figure, f"{prefix}_{mode}_breakdown", out)
