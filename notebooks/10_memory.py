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
# # 10 · Memory: will it fit?
#
# Before the time of a step, the first question is whether it runs at all. The tracer sees
# every tensor the step creates, with its size and dtype, and, since the meta device counts
# references as a GPU does, when PyTorch frees it (after its last use by a kernel, a Python
# variable or a tensor autograd saved for the backward). `nslib.model.memory` turns that into the
# memory alive at every kernel and adds what lives for the whole step:
#
# - **weights** (parameters and buffers), **grads** (one per trainable parameter, kept between
#   steps as the trace assumes), **optimizer** states (Adam: two FP32 moments, plus its
#   multi-tensor step's temporary; SGD: a momentum buffer);
# - **activations**: everything else alive at the peak (saved activations, temporaries,
#   activation gradients, the outputs the caller holds);
# - **framework**: the CUDA context and cuBLAS workspace from the datasheet's SM count (the
#   stack the context reserves for every resident thread, `nslib.model.memory.framework_bytes`),
#   not fitted;
# - per GPU under DP (plus DDP's gradient buckets), TP (shards of the sharded trace) and PP
#   (each stage's parameters and activations, GPipe micro-batches in flight).
#
# Everything is FP32, as the traced and measured steps are. This notebook: the breakdown per
# model and mode, the largest batch per GPU, per-GPU memory under DP/TP/PP, the check against
# PyTorch's real allocations on the CPU, and the comparison with Korthikanti et al. (2022).

# %% tags=["parameters"]
data = None        # NeuSight data root; None: $NSLIB_DATA or datasets/neusight
out = None         # folder for figures and tables; None: figures/interactive/ (make reproduce: figures/)
models = ["gpt2_large", "gpt3_xl", "gpt3_27", "bert_large", "opt_13"]
gpus = ["Tesla_P100-PCIE-16GB", "Tesla_T4", "Tesla_V100-PCIE-32GB", "NVIDIA_A100-SXM4-40GB",
        "NVIDIA_H100_80GB_HBM3"]
batch = 4          # breakdown scenario
seq = 1024
optimizer = "adam"
parallel_model = "gpt3_27"
parallel_gpu = "NVIDIA_H100_80GB_HBM3"
parallel_batch = 8
degrees = [1, 2, 4, 8]
check_batch = 4    # the CPU check: batch and sequence of the small configurations
check_seq = 64
seed = 0
quick = False      # quick profile: small models, short sequences

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from nslib.viz.figures import save_figure, save_table
from nslib.viz.scratch import notebook_out
from nslib.model.config import max_seq
from nslib.model.trace import trace
from nslib.evaluation.memcheck import SMALL_CONFIGS, compare
from nslib.data.settings import Settings
from nslib.model.memory import (GIB, korthikanti_bytes, largest_batch, layer_saved_bytes,
    memory_of, pipeline_memory)
from nslib.model.step import Parallel, Step

out = notebook_out(out)   # run by hand: figures/interactive/, never the tracked figures/
settings = Settings(data=data, quick=quick, seed=seed)  # made once, passed down

prefix = "10"
parts = ["weights", "grads", "optimizer", "activations", "framework", "comm"]
if quick:
    models, seq, batch = ["gpt2_med", "bert"], 256, 2
    gpus = gpus[::2]
    parallel_model, parallel_batch, degrees = "gpt2_med", 4, [1, 2, 4]
    check_seq = 32

# %% [markdown]
# ## Breakdown per model and mode
# One GPU (the H100 of the list, 80 GB), batch and sequence as set above. Training holds the
# weights four times over before any activation (weights, gradients, two Adam moments), and
# the activations of a training step grow with batch x sequence (and with sequence squared in
# eager attention); inference keeps only a few layers' tensors at a time.

# %%
def seq_of(model):
    """``seq``, or the model's own limit where that is shorter (BERT-Large: 512 tokens)."""
    limit = max_seq(model, data)
    return seq if limit is None else min(seq, limit)


rows = []
for m in models:
    for mode in ("inf", "train"):
        d = memory_of(gpus[-1], m, Step(batch, seq_of(m), mode), optimizer=optimizer,
                      settings=settings).to_dict()
        rows.append({"model": m, "mode": mode, "seq": seq_of(m), **{k: d[k] for k in parts},
                     "total": d["total"], "peak in": d["peak_phase"], "fits": d["fits"]})
breakdown = pd.DataFrame(rows).set_index(["model", "mode"])
save_table(breakdown, f"{prefix}_breakdown", out, digits=2)
breakdown.round(2)

# %%
fig, ax = plt.subplots(figsize=(9, 0.45 * len(breakdown) + 1.2))
labels = [f"{m} {mode}" for m, mode in breakdown.index]
left = np.zeros(len(breakdown))
for i, p in enumerate(parts):
    vals = breakdown[p].to_numpy(float)
    if (vals > 0).any():
        ax.barh(labels, vals, left=left, label=p, color=plt.get_cmap("Set2")(i))
        left += vals
ax.invert_yaxis()
ax.set(xscale="symlog", xlabel=f"peak memory (GB), batch {batch}, seq {seq} or the model's limit")
ax.legend(fontsize=8, frameon=False, loc="lower right")
save_figure(fig, f"{prefix}_breakdown", out)

# %% [markdown]
# ## Largest batch that fits, per GPU
# By bisection over the batch, with every storage's size as a law of batch and sequence from
# three small traces (`nslib.model.memory.storage_law`, exact against full traces). 0: not even
# batch 1 fits (FP32 Adam needs about 20 bytes per parameter before any activation).

# %%
rows = []
for m in models:
    for mode in ("inf", "train"):
        lb = largest_batch(m, mode, seq_of(m), gpus, optimizer, data=data)
        rows += [{"model": m, "mode": mode, "gpu": g, "largest batch": b}
                 for g, b in zip(lb["gpu"], lb["largest_batch"])]
biggest = pd.DataFrame(rows).pivot_table(index=["model", "mode"], columns="gpu",
                                         values="largest batch")[gpus]
save_table(biggest, f"{prefix}_largest_batch", out, digits=0)
biggest

# %% [markdown]
# ## Per GPU under DP, TP and PP
# Training on `parallel_gpu`, global batch `parallel_batch`. DP halves the activations per
# doubling but keeps whole copies of weights, gradients and states (and adds DDP's gradient
# buckets); TP divides weights and most activations (LayerNorms, residuals and the dropout
# after row-split GEMMs stay replicated); PP divides the blocks, while GPipe keeps every
# micro-batch's saved activations until its backward (shown: one micro-batch per GPU).

# %%
rows = []
for d in degrees:
    for kind in ("dp", "tp", "pp"):
        if d == 1 and kind != "dp":
            continue
        kw = {} if d == 1 else {kind: d}
        if kind == "pp" and d > 1:
            kw["microbatches"] = d
        try:
            mem = memory_of(parallel_gpu, parallel_model, Step(parallel_batch, seq, "train"),
                            parallel=Parallel(**kw), optimizer=optimizer,
                            settings=settings).to_dict()
        except ValueError as e:          # a degree that does not divide the model
            print(f"{kind}{d}: {e}")
            continue
        rows.append({"strategy": "1 GPU" if d == 1 else f"{kind}{d}", "degree": d,
                     **{k: mem[k] for k in parts}, "total": mem["total"],
                     "fits": mem["fits"]})
per_gpu = pd.DataFrame(rows).set_index("strategy")
save_table(per_gpu, f"{prefix}_per_gpu", out, digits=2)
per_gpu.round(2)

# %%
fig, ax = plt.subplots(figsize=(8, 3.5))
left = np.zeros(len(per_gpu))
for i, p in enumerate(parts):
    vals = per_gpu[p].to_numpy(float)
    if (vals > 0).any():
        ax.bar(per_gpu.index, vals, bottom=left, label=p, color=plt.get_cmap("Set2")(i))
        left += vals
cap = memory_of(parallel_gpu, parallel_model, Step(1, seq, "inf"),
                settings=settings).capacity / GIB
ax.axhline(cap, color="k", lw=1, ls="--", label="GPU memory")
ax.set(ylabel="peak memory per GPU (GB)",
       title=f"{parallel_model} training, global batch {parallel_batch}, seq {seq}")
ax.legend(fontsize=8, frameon=False)
save_figure(fig, f"{prefix}_per_gpu", out)

# %% [markdown]
# ## Checked against real allocations
# Small configurations of GPT-2, BERT, OPT and a Llama-style model (2-4 layers) run for real
# on the CPU: a forward under `no_grad`, and a forward + backward + multi-tensor Adam step
# (the second step, so the Adam moments exist). The reference is PyTorch's allocator total
# (profiler allocation events), independent of the trace's bookkeeping; nslib's figure is the
# same step's weights + gradients + optimizer + activations (no CUDA context on a CPU).
# Forwards agree to the byte; training steps come out a few per cent low: CPU kernels
# allocate a few temporaries inside one aten op (not visible as tensors), e.g. the embedding
# backward's per-row counts.

# %%
small = SMALL_CONFIGS   # 2-4 layers of GPT-2, BERT, OPT and a Llama-style model
check = compare(small, check_batch, check_seq).set_index(["model", "mode"])
save_table(check, f"{prefix}_check_vs_real", out, digits=2)
check.round(2)

# %% [markdown]
# ## Training activations of a GPT layer against Korthikanti et al. (2022)
# Their per-layer activation memory, `s*b*h*(34 + 5*a*s/h)` bytes, assumes 16-bit
# activations, 1-byte dropout masks and a GeLU that saves only its input. In FP32 (`e = 4`
# bytes per element, masks 1 byte) the same count is `s*b*h*(16e + 2) + a*s^2*b*(2e + 1)`.
# The trace's counterpart is what a block's forward kernels leave alive for the backward.
# With the exact GeLU (one kernel) the two agree to a fraction of a per cent (the rest is
# LayerNorm's per-row mean and 1/std, which the formula leaves out). GPT-2's default
# `gelu_new` is the tanh approximation written as separate PyTorch ops: without a fused
# kernel autograd saves three more intermediate tensors of the MLP's width (4h), 48 bytes
# per token and hidden unit in FP32, which is why real GPT-2 training uses more memory than
# the formula predicts.

# %%
hidden, heads, layers = (256, 8, 3) if quick else (1024, 16, 3)
rows = []
for s in ([64, 128] if quick else [128, 256, 512]):
    ref = korthikanti_bytes(s, 2, hidden, heads, elem_bytes=4, mask_bytes=1)
    for act in ("gelu", "gelu_new"):
        cfg = {"model_type": "gpt2", "n_embd": hidden, "n_head": heads, "n_layer": layers,
               "n_positions": max(s, 128), "vocab_size": 1000, "activation_function": act}
        got = layer_saved_bytes(trace(cfg, Step(2, s, "train")), 1)
        rows.append({"seq": s, "GeLU": act, "Korthikanti MB": ref / 1e6, "trace MB": got / 1e6,
                     "trace / formula": got / ref})
korth = pd.DataFrame(rows).set_index(["seq", "GeLU"])
save_table(korth, f"{prefix}_korthikanti", out, digits=3)
korth.round(3)
