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
# # 07 · Distributed training on one server
#
# Training steps on 4 GPUs (`-dp4`, `-tp4`, `-pp4_1` labels: GPT2-Large at global batch 4
# and 16, GPT3-XL at 4, on 4 x A100-SXM4-40GB and 4 x H100), predicted by `nslib.model.parallel`
# from the single-GPU kernel trace:
#
# - **DP**: each GPU runs batch / 4; every block's gradients are all-reduced (ring) as soon as
#   its weight-gradient GEMMs finish, overlapped with the rest of the backward:
#   step = forward + max(backward, last all-reduce).
# - **TP** (Megatron): QKV and fc1 column-split, attention output and fc2 row-split, heads
#   split, vocabulary-parallel embedding and LM head; an all-reduce of the activation after
#   attention and after the MLP, forward and backward; nothing overlaps.
# - **PP**: 4 stages of contiguous blocks, GPipe schedule over the micro-batches, activations
#   sent between stages.
#
# Links: NVLink 900 GB/s (H100), 600 GB/s (A100 SXM) at the paper's utilisation 0.72, halved
# (one direction). Each cell: measured, predicted, percent error; the single-GPU prediction of
# the same work is shown beside it where a plain label exists, to separate the kernel
# predictor's error from the parallel model's. Then a what-if: step time against the degree
# and the link bandwidth.

# %% tags=["parameters"]
data = None        # NeuSight data root; None: $NSLIB_DATA or datasets/neusight
out = None         # folder for figures and tables; None: figures/
predictors = ["neusight", "roofline"]
gpus = None        # GPU file stems; None: every GPU with distributed labels
models = None      # model names; None: every model with distributed labels
whatif_gpu = "NVIDIA_H100_80GB_HBM3"
whatif_model = "gpt3_xl"
whatif_batch = 8   # global batch of the what-if
whatif_seq = 2048
degrees = [1, 2, 4, 8]
link_bws = [32, 64, 300, 600, 900, 1800]   # GB/s (datasheet, both directions)
seed = 0
quick = False      # quick profile: quick-trained predictors, A100-SXM4 only, small what-if

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

from nslib.viz.figures import save_figure, save_table
from nslib.evaluation.model_level import evaluate_variant
from nslib.model.parallel import default_link
from nslib.model.predict import predict_model
from nslib.model.inputs import resolve_gpu
from nslib.predictors import available

prefix = "07"
names = [p for p in predictors if p in available()]
if quick:
    if gpus is None:
        gpus = ["NVIDIA_A100-SXM4-40GB"]
    whatif_model, whatif_batch, whatif_seq = "gpt2_med", 4, 256
    degrees = [d for d in degrees if d <= 4]
    link_bws = link_bws[1::2]

# %%
results = evaluate_variant("distributed", names, data=data, gpus=gpus, models=models,
                           quick=quick, with_base=True)
results["strategy"] = results["kind"] + results["degree"].astype(str) + np.where(
    results["kind"] == "pp", "_" + results["microbatches"].astype(str), "")
cols = ["gpu", "config", "strategy", "predictor", "e2e_ms", "pred_ms", "err", "comm_ms",
        "base_batch", "base_e2e_ms", "base_pred_ms", "base_err"]
table = results[cols].rename(columns={
    "e2e_ms": "measured ms", "pred_ms": "predicted ms", "err": "error %",
    "comm_ms": "predicted comm ms", "base_batch": "1-GPU batch",
    "base_e2e_ms": "1-GPU measured ms", "base_pred_ms": "1-GPU predicted ms",
    "base_err": "1-GPU error %"}).set_index(["gpu", "config", "strategy", "predictor"])
save_table(table, f"{prefix}_distributed_results", out, digits=2)
problems = results[results["note"] != ""]
problems[["gpu", "tag", "predictor", "note"]]

# %%
table

# %% [markdown]
# ## The paper's table: percent error per GPU, configuration and strategy

# %%
err_table = results.pivot_table(index="predictor", columns=["gpu", "config", "strategy"],
                                values="err")
save_table(err_table, f"{prefix}_distributed_error_table", out)
err_table.T

# %% [markdown]
# ## Mean error per predictor and strategy

# %%
summary = results.pivot_table(index="predictor", columns="kind", values="err")
summary["all"] = results.groupby("predictor")["err"].mean()
summary["1-GPU (where labelled)"] = results.groupby("predictor")["base_err"].mean()
save_table(summary, f"{prefix}_distributed_summary", out)
summary

# %% [markdown]
# ## The parallel model alone: scaling relative to one GPU
# Where the same work has a single-GPU label (H100: the per-GPU batch for DP, the global
# batch for TP and PP), the ratio step / single-GPU step removes the kernel predictor's
# single-GPU error: `measured` and `predicted` ratios and the error of the predicted ratio.

# %%
rel = results.dropna(subset=["base_e2e_ms"]).copy()
rel["measured ratio"] = rel["e2e_ms"] / rel["base_e2e_ms"]
rel["predicted ratio"] = rel["pred_ms"] / rel["base_pred_ms"]
rel["ratio error %"] = 100 * (rel["predicted ratio"] / rel["measured ratio"] - 1)
rel_table = rel.set_index(["gpu", "config", "strategy", "predictor"])[
    ["base_batch", "measured ratio", "predicted ratio",
     "ratio error %"]].rename(columns={"base_batch": "1-GPU batch"})
save_table(rel_table, f"{prefix}_distributed_scaling", out, digits=3)
rel_table

# %% [markdown]
# ## Predicted against measured

# %%
plot = results.copy()
plot["label"] = plot["gpu"].str.replace("NVIDIA ", "") + "\n" + plot["config"] + " " + \
    plot["strategy"]
piv = plot.pivot_table(index="label", columns="predictor", values="pred_ms")
meas = plot.drop_duplicates("label").set_index("label")["e2e_ms"].reindex(piv.index)
fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(piv)), 3.8))
piv.plot.bar(ax=ax, width=0.8)
ax.scatter(range(len(meas)), meas.to_numpy(), color="k", marker="_", s=500, zorder=5,
           label="measured")
ax.set(ylabel="step time (ms); black: measured", xlabel="", yscale="log")
ax.tick_params(axis="x", rotation=45, labelsize=8)
ax.legend(fontsize=8)
save_figure(fig, f"{prefix}_distributed_pred_vs_measured", out)

# %% [markdown]
# ## What-if: step time against the degree and the link bandwidth
# One model and GPU, global batch fixed, the first predictor. Left: each strategy at degree
# 1, 2, 4, 8 with the GPU's default link; right: degree 4 (or the largest) over link
# bandwidths from PCIe 3.0 (32 GB/s) to twice NVLink 4. PP is shown with one micro-batch (as
# the labels: the stages run one after the other) and with one sample per micro-batch
# (`PP-M`, M = batch: GPipe's bubble shrinks to (n - 1) / (M + n - 1)). Degrees that do not
# divide the model are skipped.

# %%
spec = resolve_gpu(whatif_gpu, data)
link0 = default_link(spec, data)
print(f"{spec.name}: default link {link0.bandwidth_gbps:g} GB/s ({link0.source}), "
      f"effective {link0.effective_gbps:g} GB/s")
strategies = {"dp": lambda d: {"dp": d}, "tp": lambda d: {"tp": d},
              "pp": lambda d: {"pp": d},
              "pp-m": lambda d: {"pp": d, "microbatches": whatif_batch if d > 1 else 1}}
rows, skipped = [], []


def whatif_point(kind, d, bw=None):
    try:
        _, s = predict_model(spec, whatif_model, whatif_batch, whatif_seq, "train",
                             predictor=names[0], data=data, quick=quick, link=bw,
                             **strategies[kind](d))
        rows.append({"strategy": kind, "degree": d,
                     "link_gbps": float(bw if bw is not None else link0.bandwidth_gbps),
                     "step_ms": s["e2e_ms"], "comm_ms": s.get("comm_ms", 0.0)})
    except ValueError as e:
        skipped.append(f"{kind}{d}{'' if bw is None else f' at {bw} GB/s'}: {e}")


for kind in strategies:
    for d in degrees:
        whatif_point(kind, d)
d_ref = 4 if 4 in degrees else max(degrees)
for kind in strategies:
    for bw in link_bws:
        whatif_point(kind, d_ref, bw)
whatif = pd.DataFrame(rows)
save_table(whatif.set_index(["strategy", "degree", "link_gbps"]), f"{prefix}_whatif", out,
           digits=2)
for s in skipped:
    print("skipped", s)

fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
base = whatif[whatif["link_gbps"] == link0.bandwidth_gbps].drop_duplicates(
    ["strategy", "degree"])
for kind, g in base.groupby("strategy"):
    axes[0].plot(g["degree"], g["step_ms"], marker="o", label=kind.upper())
one = base[(base["strategy"] == "dp") & (base["degree"] == 1)]["step_ms"]
if len(one):
    axes[0].plot(degrees, float(one.iloc[0]) / np.asarray(degrees, float), color="grey",
                 lw=0.8, ls=":", label="ideal (1 / n)")
axes[0].set(xscale="log", yscale="log", xlabel="GPUs (degree)", ylabel="step time (ms)",
            title=f"{whatif_model} batch {whatif_batch} on {spec.name}")
axes[0].set_xticks(degrees, [str(d) for d in degrees])
axes[0].xaxis.set_minor_formatter(NullFormatter())
sweep = whatif[(whatif["degree"] == d_ref)].drop_duplicates(["strategy", "link_gbps"])
for kind, g in sweep.groupby("strategy"):
    g = g.sort_values("link_gbps")
    axes[1].plot(g["link_gbps"], g["step_ms"], marker="o", label=kind.upper())
axes[1].axvline(link0.bandwidth_gbps, color="grey", lw=0.8, ls="--")
axes[1].set(xscale="log", xlabel="link bandwidth (GB/s, datasheet)", ylabel="step time (ms)",
            title=f"degree {d_ref}")
for ax in axes:
    ax.legend(fontsize=8)
fig.tight_layout()
save_figure(fig, f"{prefix}_whatif", out)
