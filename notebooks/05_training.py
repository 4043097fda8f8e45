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
# # 05 · Training-step latency of whole models
#
# Each model configuration is traced on the meta device into the kernels it launches
# (`nslib.model.trace`), every kernel is predicted, and the sum is compared with the measured
# latency in the label folder (mean of the 5 fastest of 25 runs). GPUs, models and batch sizes
# come from the labels, so a new GPU's labels join these tables without code changes.

# %% tags=["parameters"]
data = None        # NeuSight data root; None: $NSLIB_DATA or datasets/neusight
out = None         # folder for figures and tables; None: figures/interactive/ (make reproduce: figures/)
# `neusight`: the paper's method as published; `nslib`: nslib's design
predictors = ["nslib", "neusight", "roofline", "habitat", "li"]
gpus = None        # GPU file stems to evaluate; None: every GPU with labels
models = None      # model names; None: every labelled model
logo_predictors = ["nslib", "roofline", "habitat", "li"]  # also priced leave-one-GPU-out (1 fit per GPU)
seed = 0
quick = False      # quick profile: quick-trained predictors, a subset of configurations

# %%
from nslib.viz.figures import save_figure, save_table
from nslib.viz.scratch import notebook_out
from nslib.data.settings import Settings
from nslib.evaluation.model_level import report, saved_tables, time_breakdown
from nslib.viz.plots import logo_heatmap, pred_vs_measured_bars, share_bars
from nslib.predictors import available

out = notebook_out(out)   # run by hand: figures/interactive/, never the tracked figures/
settings = Settings(data=data, quick=quick, seed=seed)  # made once, passed down

mode = "train"
prefix = "05_training"[:2]
names = [p for p in predictors if p in available()]
if quick and models is None:
    models = ["bert_large", "gpt2_large"]

# %%
tables = report(mode, names, gpus=gpus, models=models, logo_predictors=logo_predictors,
                settings=settings)
for stem, table, digits in saved_tables(tables):
    save_table(table, f"{prefix}_{mode}_{stem}", out, digits=digits)
results = tables["results"]
results.loc[results["note"] != "", ["gpu", "tag", "predictor", "note"]]

# %% [markdown]
# ## The paper's table: percent error per GPU and configuration

# %%
tables["paper"].T

# %% [markdown]
# ## Leave-one-GPU-out: the training GPUs as if nobody had measured them
# Under the paper's protocol the training GPUs' labels are priced by a predictor that saw
# those GPUs' kernels. Here each training GPU's labels are priced by the predictor trained
# without it (`nslib.evaluation.folds`): its tiles are looked up from the other GPUs' kernels
# and its dispatch floor comes from the same fold, exactly as for a GPU known only by its
# datasheet. This is the model-level test of the claim that a forecast holds on a GPU nobody
# tuned on; the roofline needs no training, so its two rows agree.

# %%
logo = tables.get("logo")  # None when no training GPU has labels of this mode
if logo is not None:
    save_figure(logo_heatmap(logo, "training: mean end-to-end error (%)"), f"{prefix}_{mode}_logo", out)
logo if logo is None else logo.round(1)

# %% [markdown]
# Per class and held-out GPU, against the label CSVs' per-operator times (as the per-class
# tables below, each GPU priced by the fold that never saw it).

# %%
None if logo is None else tables["logo_per_class_by_gpu"].round(1)

# %% [markdown]
# ## Summary: mean error per GPU, in and out of distribution
# Out of distribution: a GPU absent from the kernel training data, or a model the original
# tool never saw (GPT3-XL, GPT3-2.7B, OPT-1.3B).

# %%
tables["summary"]

# %% [markdown]
# ## Per class: in and out of distribution, and per GPU
# The label CSVs hold measured per-operator latencies (forward, backward and gradient
# accumulation of each node) of a one-layer graph; repeated over the layers and grouped by the
# class of each operator, they give the measured time per class. Both sides are classed by
# operator, as notebook 04 explains: each backward kernel counts with the forward call whose
# gradient it computes (a linear layer's two GEMMs, bias-gradient sum and weight-gradient
# accumulation; dropout's backward multiply with dropout; the softmax backward's two kernels,
# `grad * output` and the row kernel, with softmax). Operators that launch no kernel
# form their own `host` class and are not compared. OPT's attention operands are copied by
# explicit `contiguous()` calls in the measured code, so the trace's copies inside today's
# `matmul` count as memory operators there (notebook 04). One difference between the measured
# model code (an older PyTorch and transformers) and today's remains: its dropout backward
# takes 2.5x its forward where today's is one masked multiply.

# %%
tables["per_class"].round(1)

# %%
tables["per_class_by_gpu"].round(1)

# %% [markdown]
# ## Summing kernels as a stream, not as separate microbenchmarks
# Each training kernel was timed alone, so its latency carries the host's dispatch of one op
# (25-50 us). In a model the host runs ahead of the GPU and a kernel costs its GPU time
# (`nslib.model.stream`): the default takes each class's learned floor off, keeping the roofline
# and a 3 us launch gap. `plain sum` adds the microbenchmark latencies as they are. The
# difference is largest where kernels are small and many: small-batch training, Switch-XL.

# %%
tables["aggregation"]

# %% [markdown]
# ## Predicted against measured milliseconds

# %%
save_figure(pred_vs_measured_bars(results), f"{prefix}_{mode}_pred_vs_measured", out)

# %% [markdown]
# ## Where the time goes
# Predicted milliseconds per kernel class for each configuration, on the first GPU listed.

# %%
first = results["gpu_key"].iloc[0]
breakdown = time_breakdown(results, first, names[0], settings=settings)
save_table(breakdown, f"{prefix}_{mode}_breakdown", out, digits=2)
save_figure(share_bars(breakdown, f"share of predicted time on {first} (%)"),
            f"{prefix}_{mode}_breakdown", out)
breakdown

# %% [markdown]
# ## Forward and backward separately
# The training labels split the step into the forward pass and everything after it
# (`bwall`); the backward pass costs about twice the forward (two GEMMs per forward GEMM).

# %%
fb = results.dropna(subset=["fw_ms", "bw_ms"]).assign(
    fw_err=lambda d: 100 * (d["pred_fw_ms"] - d["fw_ms"]).abs() / d["fw_ms"],
    bw_err=lambda d: 100 * (d["pred_bw_ms"] - d["bw_ms"]).abs() / d["bw_ms"])
fw_bw = fb.pivot_table(index="predictor", values=["fw_err", "bw_err"])
save_table(fw_bw, f"{prefix}_{mode}_fw_bw_error", out)
fw_bw
