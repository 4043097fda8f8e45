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
# # 06 · Operator fusion
#
# The fused measurements (`-fusion` labels: BERT-Large and GPT2-Large inference) ran with
# chains of elementwise kernels fused into one. `nslib.model.fusion.fuse` merges, in the traced
# kernel graph, every elementwise or memory kernel whose only consumer is another elementwise
# or memory kernel of the same phase into that consumer's group (never a GEMM). A group moves
# its external inputs and its output once (FLOPs: the members' sum) and is predicted by the
# elementwise predictor as its last op. As in the original tool's fused graphs, a group whose
# only consumer is a softmax or layernorm (scale + mask before a softmax, residual add before
# a layernorm) is merged into it and timed by that class's predictor
# (`fuse(trace, prologues=True)`, what `predict_model(..., fused=True)` uses; without
# prologues the fused error is 18.7% instead of 13.5% on this data). Here: measured and
# predicted latency of the non-fused and the fused model on every GPU with fused labels, and
# the percent error of the fused prediction, as in the paper's table. GPUs, models and batch
# sizes come from the labels.

# %% tags=["parameters"]
data = None        # NeuSight data root; None: $NSLIB_DATA or datasets/neusight
out = None         # folder for figures and tables; None: figures/
predictors = ["neusight", "roofline"]
gpus = None        # GPU file stems to evaluate; None: every GPU with fused labels
models = None      # model names; None: every model with fused labels
seed = 0
quick = False      # quick profile: quick-trained predictors, BERT only

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from nslib.viz.figures import save_figure, save_table
from nslib.model.fusion import fuse
from nslib.evaluation.model_level import evaluate_variant
from nslib.model.inputs import traced
from nslib.predictors import available

prefix = "06"
names = [p for p in predictors if p in available()]
if quick and models is None:
    models = ["bert_large"]

# %%
results = evaluate_variant("fusion", names, data=data, gpus=gpus, models=models, quick=quick,
                           with_base=True)
cols = ["gpu", "config", "predictor", "base_e2e_ms", "e2e_ms", "base_pred_ms", "pred_ms",
        "base_err", "err"]
table = results[cols].rename(columns={
    "base_e2e_ms": "measured ms", "e2e_ms": "measured fused ms",
    "base_pred_ms": "predicted ms", "pred_ms": "predicted fused ms",
    "base_err": "error %", "err": "fused error %"}).set_index(["gpu", "config", "predictor"])
save_table(table, f"{prefix}_fusion_results", out, digits=2)
problems = results[results["note"] != ""]
problems[["gpu", "tag", "predictor", "note"]]

# %%
table

# %% [markdown]
# ## The paper's table: percent error of the fused prediction per GPU and configuration

# %%
err_table = results.pivot_table(index="predictor", columns=["gpu", "config"], values="err")
save_table(err_table, f"{prefix}_fusion_error_table", out)
err_table.T

# %% [markdown]
# ## Mean error per predictor and GPU
# `fused`: the fused prediction against the fused measurement; `non-fused`: the same
# configurations without fusion against their plain labels, for reference (the part of the
# error that the single-GPU kernel predictions already carry).

# %%
summary = results.pivot_table(index="predictor", columns="gpu", values="err")
summary["fused (all)"] = results.groupby("predictor")["err"].mean()
summary["non-fused (all)"] = results.groupby("predictor")["base_err"].mean()
save_table(summary, f"{prefix}_fusion_summary", out)
summary

# %% [markdown]
# ## What fusion saves: measured against predicted speed-up
# Speed-up = non-fused ms / fused ms, per configuration.

# %%
sp = results.assign(measured=results["base_e2e_ms"] / results["e2e_ms"],
                    predicted=results["base_pred_ms"] / results["pred_ms"])
sp["label"] = sp["gpu"].str.replace("NVIDIA ", "") + "\n" + sp["config"]
fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
piv = sp.pivot_table(index="label", columns="predictor", values="pred_ms")
meas = sp.drop_duplicates("label").set_index("label")["e2e_ms"].reindex(piv.index)
piv.plot.bar(ax=axes[0], width=0.8)
axes[0].scatter(range(len(meas)), meas.to_numpy(), color="k", marker="_", s=500, zorder=5,
                label="measured")
axes[0].set(ylabel="fused latency (ms); black: measured", xlabel="", yscale="log")
axes[0].legend(fontsize=8)
spp = sp.pivot_table(index="label", columns="predictor", values="predicted")
spp["measured"] = sp.drop_duplicates("label").set_index("label")["measured"].reindex(spp.index)
spp.plot.bar(ax=axes[1], width=0.8)
axes[1].axhline(1.0, color="grey", lw=0.8)
axes[1].set(ylabel="speed-up from fusion (x)", xlabel="", ylim=(0.9, None))
for ax in axes:
    ax.tick_params(axis="x", rotation=45, labelsize=8)
fig.tight_layout()
save_figure(fig, f"{prefix}_fusion_pred_vs_measured", out)

# %% [markdown]
# ## What was fused
# Kernel counts before and after fusion, and the groups formed, for one configuration (GPT2
# when present).

# %%
tags = results.drop_duplicates("tag")
first = tags[tags["model"] != "bert_large"].iloc[0] if (tags["model"] != "bert_large").any() \
    else tags.iloc[0]
tr = traced(first["model"], int(first["batch"]), int(first["seq"]), "inf", data)
fz = fuse(tr, prologues=True)
groups = fz[fz["fused_from"].map(len) > 1]
print(f"{first['tag']}: {len(tr)} kernels -> {len(fz)} after fusion "
      f"({len(groups)} fused groups)")
kinds = groups.assign(
    members=groups["fused_from"].map(len),
    ops=groups["fused_from"].map(lambda ks: "+".join(tr.set_index("kid").loc[list(ks), "op"])))
counts = kinds.groupby("ops").agg(groups=("kid", "size"), members=("members", "first"),
                                  fused_bytes=("bytes", "mean")).sort_values(
    "groups", ascending=False)
save_table(counts, f"{prefix}_fusion_groups", out, digits=0)
counts.head(10)
