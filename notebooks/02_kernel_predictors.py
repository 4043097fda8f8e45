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
# # 02 · nslib's kernel predictor
#
# nslib's design (`nslib`) builds on NeuSight's idea: one small MLP per kernel class predicts
# how much of the roofline a *wave* of thread blocks reaches (NeuSight's law:
# `u = gamma * (1 - alpha / waves)`, both in (0, 1)); the latency is the waves times the
# roofline time of one wave divided by `u`. nslib's design replaces that law with kernel laws
# (`series` for GEMMs, `stream` for memory-bound classes) whose learned efficiencies keep
# every prediction no faster than the kernel's roofline (`docs/decisions.md`).
# Trained on the five training GPUs, tested on held-out kernels of those GPUs and of GPUs
# never seen. Beside it: the roofline, and the same network with a free latency output (the
# unbounded MLP), to show what the bound buys. NeuSight as published (`neusight`) is
# reproduced in notebook 11.

# %% tags=["parameters"]
data = None      # NeuSight data root; None: $NSLIB_DATA or datasets/neusight
out = None       # folder for figures and tables; None: figures/interactive/ (make reproduce: figures/)
epochs = None    # None: the library's default (or the quick profile's)
seed = 0
quick = False    # quick profile: a few epochs, for tests
kernelbench = None  # KernelBench timings folder; None: $NSLIB_KERNELBENCH or datasets/kernelbench

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from nslib.kernels import measured, tiles
from nslib.evaluation.metrics import ape, class_table, gpu_table
from nslib.viz.figures import save_figure, save_table
from nslib.viz.scratch import notebook_out
from nslib.evaluation.kernel_level import predict_test
from nslib.data.settings import Settings
from nslib.predictors import trained
from nslib.predictors.training import kernel_eval_frame

out = notebook_out(out)   # run by hand: figures/interactive/, never the tracked figures/

splits = measured.gpu_splits(data)
settings = Settings(data=data, quick=quick, seed=seed)  # made once, passed down
overrides = {} if epochs is None else {"epochs": epochs}  # the training's, from the parameters
splits

# %% [markdown]
# ## Train (or load) the predictors
# Training is cached by data hash and parameters: a second run loads the weights.

# %%
import time
t0 = time.time()
nslib_pred = trained("nslib", settings, **overrides)
mlp = trained("mlp", settings, **overrides)
print(f"trained or loaded in {time.time() - t0:.1f} s")

# %% [markdown]
# ## Error per class: training GPUs vs new GPUs
# New GPUs' kernels take looked-up tiles, as a GPU that was never profiled would.

# %%
names = ["roofline", "nslib", "mlp"]
preds = {n: predict_test(n, settings=settings, **overrides) for n in names}
table = pd.concat({n: class_table(p, p["pred_ms"], splits["train_gpus"], splits["new_gpus"])
                   [["train_gpus", "new_gpus"]] for n, p in preds.items()}, axis=1)
save_table(table, "02_kernel_error_by_class", out)
table

# %%
per_gpu = pd.concat({n: gpu_table(p, p["pred_ms"]) for n, p in preds.items()})
save_table(per_gpu, "02_kernel_error_by_gpu", out)
per_gpu

# %% [markdown]
# ## Leave-one-GPU-out: the protocol design choices are made on
# The table above scores the training GPUs on kernels of GPUs the predictor was trained on,
# and the new GPUs after every design choice was made. Choices are instead kept or dropped on
# this one: each training GPU is held out in turn, the predictor is trained on the other four
# and predicts the held-out GPU's test kernels with looked-up tiles, as a GPU never profiled.
# The new GPUs' columns (predicted by the predictor trained on all five) are reported, not
# used (`nslib eval-kernels --logo`; the choices and their evidence: `docs/decisions.md`).

# %%
from nslib.evaluation.kernel_level import LOGO_MEAN, evaluate_logo
from nslib.viz.plots import logo_heatmap

logo = {n: evaluate_logo(n, settings, **overrides) for n in names}
logo_table = pd.concat({n: t[[LOGO_MEAN, "worst held-out GPU"]] for n, t in logo.items()},
                       axis=1)
save_table(logo_table, "02_logo_summary", out)
save_table(logo["nslib"], "02_logo_nslib", out)
save_figure(logo_heatmap(logo["nslib"], "nslib, leave-one-GPU-out MAPE (%)"),
            "02_logo_nslib", out)
logo_table

# %% [markdown]
# ## Physical properties on synthetic datasheets
# What no measured GPU can test: scaling peak and bandwidth together by k makes a big kernel
# k times faster; more of one resource never makes a kernel slower; a GPU with 5x the
# FLOP/byte balance of every training GPU keeps memory-bound kernels near bytes / bandwidth
# and GEMMs near their roofline (`nslib.evaluation.extrapolation`; the same checks are tests).

# %%
from nslib.evaluation.extrapolation import property_checks
from nslib.predictors.gpu_range import training_ranges

balance = training_ranges(data)["ranges"]["FLOP/byte"][1]   # FLOP/byte, training GPUs
props = pd.concat({n: property_checks(trained(n, settings, **overrides), train_balance=balance)
                   for n in ["nslib", "mlp"]}, names=["predictor"]).reset_index(0)
prop_table = props.groupby(["predictor", "check"])["ok"].agg(["sum", "size"])
prop_table.columns = ["kernels passing", "kernels checked"]
save_table(prop_table, "02_property_checks", out)
prop_table

# %% [markdown]
# ## Predicted against measured, per GPU (log-log)

# %%
ns = preds["nslib"].sample(min(20000, len(preds["nslib"])), random_state=seed)
g = sns.relplot(data=ns, x="latency_ms", y="pred_ms", hue="cls", col="gpu", col_wrap=4,
                s=5, alpha=0.4, linewidth=0, height=3)
for ax in g.axes.flat:
    ax.set(xscale="log", yscale="log")
    lim = [1e-3, 1e3]
    ax.plot(lim, lim, "k--", lw=0.8)
g.set_axis_labels("measured (ms)", "nslib predicted (ms)")
save_figure(g.figure, "02_pred_vs_measured", out)

# %% [markdown]
# ## Error against the number of waves
# Few waves leave SMs idle: the partial last wave and the fixed cost `c` of the kernel laws
# are how the bounded predictor accounts for it.

# %%
err = pd.concat([p.assign(predictor=n, err=ape(p["pred_ms"], p["latency_ms"]))
                 for n, p in preds.items()])
err["waves_bin"] = pd.cut(err["waves"], [0, 1, 4, 16, 64, 256, 1024, np.inf],
                          labels=["1", "2-4", "5-16", "17-64", "65-256", "257-1024", ">1024"])
by_waves = err.groupby(["predictor", "waves_bin"], observed=True)["err"].mean().unstack(0)
save_table(by_waves, "02_error_vs_waves", out)
ax = by_waves.plot(marker="o", figsize=(7, 3.5), logy=True)
ax.set(xlabel="waves", ylabel="MAPE (%)")
save_figure(ax.figure, "02_error_vs_waves", out)

# %% [markdown]
# ## Learned utilisation curves, per GPU
# For square GEMMs of growing size: the share of the roofline reached rises with the waves
# and levels off at the learned efficiency.

# %%
from nslib.data.gpus import load_gpus
from nslib.kernels.clock import frame_columns
import nslib.kernels.sizes as K
gpus = load_gpus(data)
sizes = 2.0 ** np.arange(6, 14)
rows = []
for key, gpu in gpus.items():
    if key != gpu.key or not any(gpu.name == n for n in splits["test_gpus"]):
        continue
    f = pd.DataFrame({"cls": "linear", "op": "linear", "B": 1.0, "M": sizes, "N": sizes,
                      "K": sizes, "H": np.nan, **frame_columns(gpu)})
    f = K.add_features(nslib_pred.tiles.lookup(f))
    rows.append(f.assign(u=nslib_pred.utilisation(f)))
curves = pd.concat(rows)
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
sns.lineplot(data=curves, x="M", y="u", hue="gpu", marker="o", errorbar=None, ax=axes[0])
axes[0].set(xscale="log", xlabel="M = N = K", ylabel="predicted utilisation u")
sns.lineplot(data=curves, x="waves", y="u", hue="gpu", marker="o", errorbar=None, ax=axes[1],
             legend=False)
axes[1].set(xscale="log", xlabel="waves", ylabel="u")
save_figure(fig, "02_utilisation_curves", out)

# %% [markdown]
# ## How often the looked-up tile is the tile the library chose
# On the test GPUs whose kernel names we know, compare the parsed tile with the one looked up
# from the nearest training kernel.

# %%
test_all = kernel_eval_frame(data)
agree = tiles.agreement(test_all, nslib_pred.tiles.lookup(test_all))
agree = agree.pivot(index="gpu", columns="cls", values="match")
save_table(agree * 100, "02_tile_lookup_agreement", out)
agree * 100

# %% [markdown]
# ## Training curves (validation SMAPE per epoch)

# %%
fig, ax = plt.subplots(figsize=(7, 3.5))
for cls, hist in nslib_pred.history.items():
    ax.plot(np.arange(1, len(hist) + 1), hist, label=cls)
ax.set(xlabel="epoch", ylabel="validation SMAPE", yscale="log")
ax.legend()
save_figure(fig, "02_training_curves", out)

# %% [markdown]
# ## Where nslib's design misses its targets, and why
# The targets are 10% on the training GPUs' test kernels and 12-25% on new GPUs. For every
# (class, GPU) above 10%, the kernels that contribute most to the error: the kernel family
# the library chose (from the profiled name) and how far the test sizes lie outside training.
# The largest single cause on this data: Tesla P4 linear test kernels mostly run
# `sgemm_128x128x8_NT_vec`, a kernel the P4 never ran in the training split (its training
# tiles are 64x64, 128x32 and 32x128), reaching a utilisation no training kernel reached.

# %%
ns_err = err[err["predictor"] == "nslib"].copy()
ns_err["family"] = ns_err["kernel_name"].str.extract(r"([A-Za-z0-9_]*gemm[A-Za-z0-9_]*|"
                                                     r"[a-z_]+_kernel|softmax\w*)")[0]
worst = (ns_err.groupby(["cls", "gpu"])["err"].mean().loc[lambda s: s > 10].index)
train_waves = {c: f["waves"].max()
                               for c, f in measured.kernel_tables("train", data).items()}
rows = []
for cls, gpu in worst:
    sub = ns_err[(ns_err["cls"] == cls) & (ns_err["gpu"] == gpu)]
    share = sub.groupby("family")["err"].sum().div(sub["err"].sum()).sort_values()
    top = share.index[-1]
    rows.append({"cls": cls, "gpu": gpu, "mape": sub["err"].mean(), "top family": top,
                 "its share of the error": share.iloc[-1] * 100,
                 "rows beyond training waves (%)": (sub["waves"] > train_waves[cls]).mean() * 100})
misses = pd.DataFrame(rows)
save_table(misses.set_index(["cls", "gpu"]), "02_target_misses", out)
misses

# %% [markdown]
# ## KernelBench: another harness, on GPUs the NeuSight data never measured
# KernelBench's public eager timings (level 1: single FP32 operators) on six campaigns,
# among them three Ampere GA102 boards with 128 FP32 lanes per SM. Each problem file is traced
# on the meta device by the same recorder as the models; those that launch exactly one kernel
# of an nslib class become kernel rows on their GPU's datasheet (the rest are counted, not
# priced). Every predictor is trained on the NeuSight training GPUs only: the T4 campaign is a
# training GPU measured again by another harness, the other GPUs (the A100 SXM4 boards among
# them) were never trained on. The harness times one Python call: its fixed cost per campaign is
# bounded by `measured - roofline` over the campaign's problems and added to every predictor's
# kernel GPU time (`nslib.evaluation.kernelbench`; `nslib eval-kernels --kernelbench`).
# The last two rows are the shape families the training GPUs never showed: matrix-vector
# products and long reductions (split-K). `nslib` is nslib's design, `neusight` the paper's
# method as published.

# %%
from nslib.data.paths import DataNotFoundError
from nslib.evaluation import kernelbench as kbe

kb_names = ["nslib", "neusight", "roofline", "habitat", "li"]
try:
    kb_res = kbe.evaluate(kb_names, root=kernelbench, settings=settings, **overrides)
except DataNotFoundError as e:
    kb_res = None
    print(f"KernelBench timings not found; this section is skipped. {e}")
if kb_res is not None:
    kb_table = pd.concat({n: kb_res[n][kbe.MEAN] for n in kb_names}, axis=1)
    kb_by_gpu = pd.concat({n: kb_res[n].drop(columns=kbe.MEAN) for n in kb_names})
    save_table(kb_table, "02_kernelbench_summary", out)
    save_table(kb_by_gpu, "02_kernelbench_by_gpu", out)
    print(f"{len(kb_res['frame'])} priced problem runs; skipped:",
          kb_res["skipped"]["reason"].value_counts().to_dict())
    ax = kb_table.plot.bar(figsize=(10, 4), rot=20)
    ax.set_ylabel("MAPE (%), mean over the KernelBench GPUs")
    ax.set_title("KernelBench level 1, predictors trained on the NeuSight training GPUs")
    save_figure(ax.figure, "02_kernelbench", out)
    display(kb_by_gpu.loc["nslib"].round(1))
kb_table.round(1) if kb_res is not None else None

