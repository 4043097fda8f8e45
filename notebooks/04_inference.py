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
# # 04 · Inference latency of whole models
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
kernelbench = None  # KernelBench timings folder; None: $NSLIB_KERNELBENCH or datasets/kernelbench
kernelbench_levels = [3, 2, 1]  # whole models, fused chains, single operators; [] skips
own_modules = True  # forecast two modules written below on every datasheet of the data
mixed = None       # 16-bit data root (its datasheets give tensor-core peaks); None: $NSLIB_MIXED or datasets/mixed

# %%
from nslib.viz.figures import save_figure, save_table
from nslib.viz.scratch import notebook_out
from nslib.data.settings import Settings
from nslib.evaluation.model_level import report, saved_tables, time_breakdown
from nslib.viz.plots import logo_heatmap, pred_vs_measured_bars, share_bars
from nslib.predictors import available

out = notebook_out(out)   # run by hand: figures/interactive/, never the tracked figures/
settings = Settings(data=data, quick=quick, seed=seed, mixed=mixed)  # made once, passed down

mode = "inf"
prefix = "04_inference"[:2]
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
    save_figure(logo_heatmap(logo, "inference: mean end-to-end error (%)"), f"{prefix}_{mode}_logo", out)
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
# The label CSVs hold measured per-operator latencies of a one-layer graph; repeated over the
# layers and grouped by the class of each operator, they give the measured time per class.
# The comparison is like for like on both sides (`nslib.evaluation.per_class`):
# - **By operator.** A graph node is one PyTorch call, and the trace files each kernel under
#   the call that launched it (in the backward, the forward call whose gradient runs): the
#   operand copies of a `matmul` count with its `bmm`, a linear layer's bias-gradient sum and
#   weight-gradient accumulation with the linear layer, dropout's backward with dropout.
# - **By what a node launches.** The graph's unnamed nodes are classed by the function they
#   call (`torch.max(a, b)` is an elementwise maximum, casts and embeddings are memory ops);
#   selects (`where`, `masked_fill`) are elementwise on both sides.
# - **Timed one at a time.** Each node was timed alone, like a kernel microbenchmark, so each
#   predicted operator is its kernels' stream times plus one dispatch.
#
# Nodes that launch no kernel (views, getitems, sizes: 7-9 us each, 4-28 ms per model) form
# their own `host` class and are not compared: the table after next shows from the data that
# they cost nothing end to end. `elementwise + memory` sums the two streaming classes.
# Where the measured model's code differs from today's transformers, the operand copies of a
# batched GEMM follow the measured code: OPT's copies its attention operands with explicit
# `contiguous()` calls before a `torch.bmm` (which cannot copy), so the trace's copies inside
# today's `matmul` count as memory operators there; GPT-2, GPT-3 and BERT call `matmul`, whose
# node times its own copies.

# %%
tables["per_class"].round(1)

# %%
tables["per_class_by_gpu"].round(1)

# %% [markdown]
# ## Host-only operators overlap GPU work
# For every single-GPU label with a per-operator CSV: the measured end-to-end time over the sum
# of all timed operators, and over the sum of the kernel-launching ones only. The second ratio
# sits at 1 where the first falls below it: the host runs ahead of the GPU, so the host-only
# operators hide behind kernels and a forecast prices them at zero.

# %%
from nslib.evaluation.per_class import host_overlap

overlap = host_overlap(data)
overlap_by_gpu = overlap.groupby("gpu_key")[["host_ms", "e2e_over_all", "e2e_over_kernels"]].median()
save_table(overlap_by_gpu, f"{prefix}_host_ops_overlap", out, digits=3)
overlap_by_gpu

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
# ## Does the error grow with the batch?
# Larger batches mean more waves per kernel, where the utilisation saturates: errors should
# not grow with the batch for a model that extrapolates in size.

# %%
by_batch = results.pivot_table(index=["model", "batch"], columns="predictor", values="err")
save_table(by_batch, f"{prefix}_{mode}_error_by_batch", out)
by_batch

# %% [markdown]
# ## Any PyTorch module: KernelBench's whole models and fused chains
# Not a HuggingFace config: each KernelBench level-3 problem (LeNet to ResNet-101, VGG,
# DenseNet, MobileNet, EfficientNet, ViT, RNN/LSTM/GRU, MinGPT blocks, U-Net) and level-2 chain
# (a convolution or GEMM followed by activations, norms, pooling) is traced from its own file on
# the meta device, as its harness ran it (the module as built, in training mode), and priced on
# the datasheet of the GPU it ran on like any step: convolutions as implicit GEMMs (a wide 3x3
# stride-1 one as cuDNN's FP32 Winograd F(4x4, 3x3), its transforms and 36 small GEMMs, when the
# datasheet's roofline says that form is faster), batch norms
# and pooling as streams (a 2-D batch norm, a group norm and `logsumexp` as the several kernels
# PyTorch launches for them), recurrent layers as cuDNN's standard algorithm launches them
# (`nslib.evaluation.kernelbench_models`; `nslib eval-models --kernelbench --level 3`). Level 1
# checks those kernels one operator at a time: its single convolutions, poolings, norms,
# reductions and losses (the operators the kernel table of notebook 02 has no class for), each
# priced as a one-call step, per family.
# Predictors are trained on the NeuSight training GPUs; problems that do not trace, or hold ops
# without a kernel mapping, are listed with the reason, not scored. The host is the campaign's:
# each operator call costs it the campaign's cheapest level-1 call (about 3 us on one machine,
# 21-50 us on the others) times the class's floor ratio, not the NeuSight hosts' floor (and
# no more than the least any one-kernel level-1 problem of its class took beyond its roofline); a
# call's further kernels (cuDNN's per-step kernels) are launched from C++, each at 0.175 of
# that call (`nslib.model.stream.library_launch_ms`). Beside the errors, `trial_cv` is how
# steady each machine was while it measured: the median over the problems of their 100 trials'
# standard deviation over their mean (%). Where nothing else ran it is a few %; a campaign far
# above the others timed more than its GPU's work, and a forecast of the GPU cannot follow it.

# %%
from nslib.data.paths import DataNotFoundError
from nslib.evaluation import kernelbench_models as kbm
from nslib.viz.measured_plots import error_bars, predicted_vs_measured

kb_steps = {}
for level in kernelbench_levels:
    try:
        kb_steps[level] = kbm.evaluate(["nslib", "roofline"], root=kernelbench, level=level,
                                       settings=settings)
    except DataNotFoundError as e:
        print(f"KernelBench timings not found; this section is skipped. {e}")
        break
for level, st in kb_steps.items():
    per_gpu, per_family = kbm.summary(st), kbm.summary(st, by=("family",))
    save_table(per_gpu, f"04_kernelbench_level{level}", out)
    save_table(per_family, f"04_kernelbench_level{level}_families", out)
    skipped = st[st["reason"] != ""].drop_duplicates("problem")
    save_table(skipped.set_index("problem")[["reason", "unpriced", "unpriced_share"]],
               f"04_kernelbench_level{level}_unpriced", out)
    bars = per_gpu.rename(columns={"n_priced": "n"}).drop(columns=["n_total", "trial_cv"],
                                                         errors="ignore")
    what = {1: "single operators without a kernel class", 2: "fused chains",
            3: "whole models"}[level]
    fig = error_bars(bars, f"KernelBench level {level} ({what}): median error of the priced "
                     "problems")
    fig.axes[0].set_ylabel("median APE (%)")
    save_figure(fig, f"04_kernelbench_level{level}", out)
    priced = st[st["reason"] == ""]
    save_figure(predicted_vs_measured(priced, ["nslib", "roofline"], "family",
                                      f"KernelBench level {level} ({what}), every priced "
                                      "problem run"),
                f"04_kernelbench_level{level}_scatter", out)
    print(f"level {level}: {len(priced)} of {len(st)} problem runs priced;",
          "median error per family:", per_family["nslib"].round(1).to_dict())
    display(per_gpu.round(1))

# %% [markdown]
# ## Your own module
#
# The door the KernelBench problems went through takes any `nn.Module`: a class or factory
# and its input shapes (`predict_model(gpu, module, inputs=[...])`, or
# `nslib predict --gpu G --module file.py:Name --inputs 8x3x64x64`). The module is built on the
# meta device (no weights, no memory), one inference forward, or with `Step(..., "train")`
# (`--mode train`) a training step, forward and backward, is traced and priced on the
# datasheet. Below, a small CNN and a two-layer GRU written here, on every FP32 datasheet of
# the data: where the time goes changes with the GPU (the GRU's hundreds of small kernels are
# the host's, whatever the GPU; the CNN's convolutions are GEMMs, its wide 3x3 one as Winograd's
# transforms and 36 small GEMMs where the datasheet says that is faster). A training step adds the
# backward: each layer's two gradient GEMMs, the norms' and activations' backward kernels,
# and for the GRU cuDNN's backward (per step a pointwise kernel and a GEMM, then the weight
# gradients over every step).

# %%
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch.nn as nn

from nslib.data.gpus import load_gpus
from nslib.model.predict import predict_model
from nslib.model.step import Step


def small_cnn():
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


class GRUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn, self.head = nn.GRU(64, 128, num_layers=2, batch_first=True), nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


own = {"small CNN, 32 x 3x64x64": (small_cnn, [(32, 3, 64, 64)]),
       "2-layer GRU, 16 x 100 steps": (GRUNet, [(16, 100, 64)])}
rows = []
if own_modules:
    sheets = {g.name: g for g in load_gpus(data).values()}   # one per Device name
    for gpu in sheets.values():
        for what, (factory, shapes) in own.items():
            for mode in ("inf", "train"):
                with warnings.catch_warnings():   # the datasheet-range notes are in the summary
                    warnings.simplefilter("ignore")
                    _, summ = predict_model(gpu, factory, Step(1, 1, mode), inputs=shapes,
                                            settings=settings)
                rows.append({"gpu": gpu.name, "module": what, "mode": mode,
                             "ms": summ["e2e_ms"], "backward ms": summ["bw_ms"],
                             "kernels": summ["n_kernels"], **summ["per_class_ms"]})
own_table = pd.DataFrame(rows)
if len(own_table):
    keys = ["module", "mode", "gpu"]
    save_table(own_table.set_index(keys), "04_own_modules", out)
    per_class = own_table.set_index(keys).drop(columns=["ms", "backward ms", "kernels"])
    per_class = per_class.fillna(0)
    modes = {"inf": "inference forward", "train": "training step"}
    fig, axes = plt.subplots(len(modes), len(own), squeeze=False, sharey=True,
                             figsize=(5 * len(own) + 2, 2 * (0.45 * len(sheets) + 1.5)))
    for i, (mode, label) in enumerate(modes.items()):
        for j, what in enumerate(own):
            ax = axes[i, j]
            per_class.loc[(what, mode)].plot.barh(stacked=True, ax=ax,
                                                  legend=(i, j) == (0, len(own) - 1))
            ax.set(title=f"{what}: {label}", xlabel="forecast ms, per kernel class",
                   ylabel="")
    save_figure(fig, "04_own_modules", out)
    display(own_table.pivot_table(index="gpu", columns=["module", "mode"], values="ms")
            .round(3))

# %% [markdown]
# ### TF32 convolutions on tensor cores
#
# PyTorch lets cuDNN run FP32 convolutions in TF32 on the tensor cores by default
# (`torch.backends.cudnn.allow_tf32`), matmuls not. With `tf32=True` (`nslib predict --module
# ... --tf32`), where a datasheet gives the tensor-core peak (`Bf16FLOPs`; TF32 runs at half
# that rate), a convolution's implicit GEMM is also priced by the 16-bit GEMM predictor on the
# datasheet's TF32 twin (twice the bytes per element: half the peak, bandwidth and L2), its
# input read once from DRAM and its overlapping windows from L2, and runs in whichever form is
# faster, as cuDNN picks. It is off by default: tried on KernelBench's campaigns with their
# vendors' tensor-core peaks added, it fixed the wide 3x3 models (VGG-16 on the A100: 1.39x
# -> 0.93x) but took thin-channel convolutions below their measured times, and the medians got
# worse (docs/decisions.md). Below, a VGG-style block (two wide 3x3 convolutions, where TF32
# pays) and the small CNN above (thin layers, host-bound) on the 16-bit data's datasheets, as
# nslib prices them and with TF32 allowed.

# %%
from nslib.data.gpus import load_mixed_gpus_if_present

def vgg_block():
    return nn.Sequential(nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))


wide_and_thin = {"VGG-style block, 32 x 64x112x112": (vgg_block, [(32, 64, 112, 112)]),
                 "small CNN, 32 x 3x64x64": own["small CNN, 32 x 3x64x64"]}
tf32_rows = []
tensor_sheets = {g.name: g for g in load_mixed_gpus_if_present(mixed).values()} \
    if own_modules else {}
for gpu in tensor_sheets.values():
    for what, (factory, shapes) in wide_and_thin.items():
        for mode in ("inf", "train"):
            got = {}
            for allowed in (False, True):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    _, got[allowed] = predict_model(gpu, factory, Step(1, 1, mode),
                                                    inputs=shapes, settings=settings,
                                                    tf32=allowed)
            tf32_rows.append({"module": what, "mode": mode, "gpu": gpu.name,
                              "FP32 ms": got[False]["e2e_ms"],
                              "TF32 allowed ms": got[True]["e2e_ms"],
                              "TF32 kernels": got[True]["tf32_kernels"],
                              "speed-up": got[False]["e2e_ms"] / got[True]["e2e_ms"]})
tf32_table = pd.DataFrame(tf32_rows)
if len(tf32_table):
    save_table(tf32_table.set_index(["module", "mode", "gpu"]), "04_own_tf32", out, digits=3)
    display(tf32_table.pivot_table(index="gpu", columns=["module", "mode"], values="speed-up")
            .round(2))
else:
    print("no 16-bit datasheets (../shared/mixed): nothing can run in TF32")
