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
# # 01 · The kernel measurements and the roofline
#
# NeuSight learns from single kernels (one GEMM, one elementwise op, ...) timed on five
# older GPUs, and is tested on held-out kernels of those GPUs and of newer ones. This notebook
# shows what was measured, where the kernels sit under each GPU's roofline, and how far the
# plain roofline is from the measurements — the gap every later predictor tries to close.

# %% tags=["parameters"]
data = None          # NeuSight data root; None: $NSLIB_DATA or datasets/neusight
out = None           # folder for figures and tables; None: figures/interactive/ (make reproduce: figures/)
quick = False        # quick mode: subsample the scatter plots
seed = 0

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from nslib.kernels import measured, sizes
from nslib.evaluation.metrics import class_table, gpu_table
from nslib.viz.figures import save_figure, save_table
from nslib.viz.scratch import notebook_out
from nslib.data.gpus import load_gpus

out = notebook_out(out)   # run by hand: figures/interactive/, never the tracked figures/

sample = 3000 if quick else 20000
splits = measured.gpu_splits(data)
train = measured.kernel_tables("train", data)
test = measured.kernel_tables("test", data)
splits

# %% [markdown]
# ## What was measured, on which GPUs
# Rows are kernels; the training split covers the training GPUs only, the test split adds the
# new GPUs (found from the data, not from a list).

# %%
counts = pd.concat({s: pd.concat(t.values()).groupby(["cls", "gpu"]).size().unstack(fill_value=0)
                    for s, t in (("train", train), ("test", test))})
save_table(counts, "01_kernel_counts", out, digits=0)
counts

# %%
gpus = pd.DataFrame([g.to_json() for g in load_gpus(data).values()]).set_index("Device")
gpus["balance (FLOP/byte)"] = gpus["SingleFLOPs"] / gpus["Mem_Bw"]
gpus

# %% [markdown]
# ## Latency against FLOPs (GEMMs) and bytes (vector ops)
# GEMMs scale with FLOPs, vector ops with bytes; the spread at a given size is what tiles,
# waves and caches add.

# %%
def sampled(frame, n):
    return frame.sample(min(n, len(frame)), random_state=seed)

both = pd.concat([sampled(pd.concat([train[c], test[c]]), sample) for c in sizes.CLASSES])
both["size"] = np.where(both["cls"].isin(sizes.GEMM_CLASSES), both["flops"], both["bytes"])
g = sns.relplot(data=both, x="size", y="latency_ms", hue="gpu", col="cls", col_wrap=3,
                kind="scatter", s=6, alpha=0.5, linewidth=0,
                facet_kws={"sharex": False, "sharey": False})
g.set(xscale="log", yscale="log")
g.set_axis_labels("FLOPs (GEMM) or bytes (vector ops)", "measured latency (ms)")
save_figure(g.figure, "01_latency_vs_size", out)

# %% [markdown]
# ## Where the kernels sit under the roofline
# Achieved throughput (FLOP/s) against arithmetic intensity, one panel per GPU; the line is
# `min(peak, intensity x bandwidth)`. Nothing may sit above it.

# %%
gemm = pd.concat([train["bmm"], train["linear"], test["bmm"], test["linear"]])
gemm = sampled(gemm, sample * 2)
gemm["achieved_gflops"] = gemm["flops"] / (gemm["latency_ms"] * 1e-3) / 1e9
gemm["intensity_exact"] = gemm["flops"] / gemm["bytes"]
names = sorted(gemm["gpu"].unique())
fig, axes = plt.subplots(2, (len(names) + 1) // 2, figsize=(4 * ((len(names) + 1) // 2), 7),
                         sharex=True, sharey=True, squeeze=False)
xs = np.logspace(-1, 3, 100)
for ax, name in zip(axes.flat, names):
    sub = gemm[gemm["gpu"] == name]
    spec = sub.iloc[0]
    ax.scatter(sub["intensity_exact"], sub["achieved_gflops"], s=3, alpha=0.4, c=sub["waves"],
               cmap="viridis", norm=plt.matplotlib.colors.LogNorm())
    ax.plot(xs, np.minimum(spec["peak_gflops"], xs * spec["mem_bw"]), "r-", lw=1.5)
    ax.set(xscale="log", yscale="log", title=name)
for ax in axes.flat[len(names):]:
    ax.set_visible(False)
fig.supxlabel("arithmetic intensity (FLOP/byte)")
fig.supylabel("achieved GFLOP/s (colour: waves)")
save_figure(fig, "01_gemm_roofline", out)

# %% [markdown]
# ## How wrong is the roofline?
# Mean absolute percentage error on the test kernels, the paper's metric, split by whether the
# GPU was among the training GPUs. The roofline needs no training, so the split only says how
# different the two groups of kernels are.

# %%
test_all = pd.concat(test.values(), ignore_index=True)
roof = sizes.roofline_ms(test_all)
roof_table = class_table(test_all, roof, splits["train_gpus"], splits["new_gpus"])
save_table(roof_table, "01_roofline_error", out)
roof_table

# %%
per_gpu = gpu_table(test_all, roof)
save_table(per_gpu, "01_roofline_error_per_gpu", out)
fig, ax = plt.subplots(figsize=(9, 3.5))
sns.heatmap(per_gpu, annot=True, fmt=".0f", cmap="rocket_r", ax=ax,
            cbar_kws={"label": "roofline MAPE (%)"})
save_figure(fig, "01_roofline_error_heatmap", out)

# %% [markdown]
# The roofline is always optimistic: real kernels reach only part of the peak, less so with
# few waves (a partly idle GPU) and small tiles. NeuSight learns that fraction; notebook 02
# trains nslib's bounded predictor (`nslib`), which builds on the same idea.
