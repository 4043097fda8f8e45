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
out = None         # folder for figures and tables; None: figures/interactive/ (make reproduce: figures/)
# `neusight`: the paper's method as published; `nslib`: nslib's design
predictors = ["nslib", "neusight", "roofline"]
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
from nslib.viz.figures import save_figure, save_table
from nslib.viz.scratch import notebook_out
from nslib.data.settings import Settings
from nslib.evaluation.model_level import evaluate_variant
from nslib.evaluation.parallel_eval import (parallel_error_table, parallel_summary,
                                            parallel_table, scaling_table, with_strategy)
from nslib.model.inputs import resolve_gpu
from nslib.model.parallel import default_link
from nslib.explore.parallel import link_sweep_degree, parallel_whatif
from nslib.model.step import Step
from nslib.predictors import available
from nslib.viz.variant_plots import parallel_bars, whatif_lines

out = notebook_out(out)   # run by hand: figures/interactive/, never the tracked figures/
settings = Settings(data=data, quick=quick, seed=seed)  # made once, passed down

prefix = "07"
names = [p for p in predictors if p in available()]
if quick:
    if gpus is None:
        gpus = ["NVIDIA_A100-SXM4-40GB"]
    whatif_model, whatif_batch, whatif_seq = "gpt2_med", 4, 256
    degrees = [d for d in degrees if d <= 4]
    link_bws = link_bws[1::2]

# %%
results = with_strategy(evaluate_variant("distributed", names, gpus=gpus, models=models,
                                         with_base=True, settings=settings))
table = parallel_table(results)
save_table(table, f"{prefix}_distributed_results", out, digits=2)
results.loc[results["note"] != "", ["gpu", "tag", "predictor", "note"]]

# %%
table

# %% [markdown]
# ## The paper's table: percent error per GPU, configuration and strategy

# %%
err_table = parallel_error_table(results)
save_table(err_table, f"{prefix}_distributed_error_table", out)
err_table.T

# %% [markdown]
# ## Mean error per predictor and strategy

# %%
summary = parallel_summary(results)
save_table(summary, f"{prefix}_distributed_summary", out)
summary

# %% [markdown]
# ## The parallel model alone: scaling relative to one GPU
# Where the same work has a single-GPU label (H100: the per-GPU batch for DP, the global
# batch for TP and PP), the ratio step / single-GPU step removes the kernel predictor's
# single-GPU error: `measured` and `predicted` ratios and the error of the predicted ratio.

# %%
rel_table = scaling_table(results)
save_table(rel_table, f"{prefix}_distributed_scaling", out, digits=3)
rel_table

# %% [markdown]
# ## Predicted against measured

# %%
save_figure(parallel_bars(results), f"{prefix}_distributed_pred_vs_measured", out)

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
whatif, skipped = parallel_whatif(spec, whatif_model, Step(whatif_batch, whatif_seq, "train"),
                                  degrees, link_bws, names[0], settings=settings)
save_table(whatif.set_index(["strategy", "degree", "link_gbps"]), f"{prefix}_whatif", out,
           digits=2)
for s in skipped:
    print("skipped", s)

# %%
fig = whatif_lines(whatif, degrees, link_sweep_degree(degrees), link0.bandwidth_gbps,
                   title=f"{whatif_model} batch {whatif_batch} on {spec.name}")
save_figure(fig, f"{prefix}_whatif", out)
