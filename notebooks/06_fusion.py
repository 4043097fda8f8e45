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
# (`fuse(trace, prologues=True)`, what `predict_model(..., fused=True)` uses). Here: measured and
# predicted latency of the non-fused and the fused model on every GPU with fused labels, and
# the percent error of the fused prediction, as in the paper's table. GPUs, models and batch
# sizes come from the labels.

# %% tags=["parameters"]
data = None        # NeuSight data root; None: $NSLIB_DATA or datasets/neusight
out = None         # folder for figures and tables; None: figures/interactive/ (make reproduce: figures/)
# `neusight`: the paper's method as published; `nslib`: nslib's design
predictors = ["nslib", "neusight", "roofline"]
logo_predictors = ["nslib", "roofline"]  # also priced leave-one-GPU-out (1 fit per GPU)
gpus = None        # GPU file stems to evaluate; None: every GPU with fused labels
models = None      # model names; None: every model with fused labels
seed = 0
quick = False      # quick profile: quick-trained predictors, BERT only

# %%
from nslib.viz.figures import save_figure, save_table
from nslib.viz.scratch import notebook_out
from nslib.evaluation.fusion_eval import (fused_group_counts, fusion_example, fusion_speedups,
                                          fusion_summary, fusion_table)
from nslib.data.settings import Settings
from nslib.evaluation.model_level import evaluate_variant, paper_table, variant_logo
from nslib.model.fusion import fuse
from nslib.model.inputs import traced
from nslib.predictors import available
from nslib.viz.variant_plots import fusion_bars

out = notebook_out(out)   # run by hand: figures/interactive/, never the tracked figures/
settings = Settings(data=data, quick=quick, seed=seed)  # made once, passed down

prefix = "06"
names = [p for p in predictors if p in available()]
logo_names = [p for p in names if p in logo_predictors]
if quick and models is None:
    models = ["bert_large"]

# %%
results = evaluate_variant("fusion", names, gpus=gpus, models=models, with_base=True,
                           settings=settings)
table = fusion_table(results)
save_table(table, f"{prefix}_fusion_results", out, digits=2)
results.loc[results["note"] != "", ["gpu", "tag", "predictor", "note"]]

# %%
table

# %% [markdown]
# ## The paper's table: percent error of the fused prediction per GPU and configuration

# %%
err_table = paper_table(results)
save_table(err_table, f"{prefix}_fusion_error_table", out)
err_table.T

# %% [markdown]
# ## Mean error per predictor and GPU
# `fused`: the fused prediction against the fused measurement; `non-fused`: the same
# configurations without fusion against their plain labels, for reference (the part of the
# error that the single-GPU kernel predictions already carry).

# %%
summary = fusion_summary(results)
save_table(summary, f"{prefix}_fusion_summary", out)
summary

# %% [markdown]
# ## Leave-one-GPU-out
# Fused labels of a training GPU priced by the predictor trained without that GPU (as in
# notebook 04), beside the paper's protocol; None when no training GPU has fused labels.

# %%
fusion_logo = variant_logo("fusion", results[results["predictor"].isin(logo_names)], logo_names,
                           models=models, settings=settings)
if fusion_logo is not None:
    save_table(fusion_logo, f"{prefix}_fusion_logo", out)
fusion_logo

# %% [markdown]
# ## What fusion saves: measured against predicted speed-up
# Speed-up = non-fused ms / fused ms, per configuration.

# %%
save_figure(fusion_bars(fusion_speedups(results)), f"{prefix}_fusion_pred_vs_measured", out)

# %% [markdown]
# ## What was fused
# Kernel counts before and after fusion, and the groups formed, for one configuration (GPT2
# when present).

# %%
example = fusion_example(results)
tr = traced(example["model"], int(example["batch"]), int(example["seq"]), "inf", data)
fz = fuse(tr, prologues=True)
counts = fused_group_counts(tr, fz)
print(f"{example['tag']}: {len(tr)} kernels -> {len(fz)} after fusion "
      f"({counts['groups'].sum()} fused groups)")
save_table(counts, f"{prefix}_fusion_groups", out, digits=0)
counts.head(10)
