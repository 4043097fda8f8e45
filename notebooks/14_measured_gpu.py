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
# # 14 · A GPU we measured ourselves: the forecast against the stopwatch
#
# Every other notebook checks nslib against measurements somebody else took. This one checks it
# against GPUs this project measured with its own collector, `nslib collect`, run on a machine
# with the GPU:
#
# ```
# nslib collect --out datasets/measured/<gpu>_<date> --minutes 10 --datasheet vendor.json
# ```
#
# In its time budget the collector times FP32 kernels of NeuSight's classes over the data's
# sampled dims, BF16 GEMMs and scaled-dot-product attention (prefill and decode) as replayed
# CUDA graphs, and whole model steps; it writes them in the layouts nslib reads (a NeuSight data
# root, a 16-bit data root), with the GPU's datasheet and a provenance record. Nothing here
# trains on the measured GPU: each forecast comes from its datasheet alone, by predictors
# trained on the data's GPUs, exactly as for a GPU nobody measured.

# %% tags=["parameters"]
measured = None   # a collection, or a folder of them; None: datasets/measured
data = None       # NeuSight data root; None: $NSLIB_DATA or datasets/neusight
mixed = None      # 16-bit data root; None: $NSLIB_MIXED or datasets/mixed
out = None        # figures and tables; None: figures/interactive/ (make reproduce: figures/)
quick = False     # quick profile (tests)
seed = 0
fp32_predictors = ["nslib", "neusight", "roofline", "habitat", "li"]
tensor_predictors = ["nslib", "roofline", "roofline_eff", "xgboost"]
step_predictors = ["nslib", "neusight", "roofline"]

# %%
import json

import numpy as np
import pandas as pd

from nslib.evaluation import measured_gpu as mg
from nslib.viz.figures import save_figure, save_table
from nslib.viz.measured_plots import error_bars, predicted_vs_measured, step_bars
from nslib.viz.scratch import notebook_out

out = notebook_out(out)   # run by hand: figures/interactive/, never the tracked figures/
folders = mg.collections(measured if measured is not None else mg.DEFAULT_ROOT)
if not folders:
    raise SystemExit("no `nslib collect` output found: run the collector on a GPU first")
reports = [mg.report(f, fp32_predictors, tensor_predictors, step_predictors, data, mixed,
                     quick, seed) for f in folders]
[r["gpu"] for r in reports]

# %% [markdown]
# ## What was measured, and how
#
# The provenance record of each collection: versions, the timing protocol, rows per part and
# what was skipped (shapes too long for the budget are counted, never dropped silently).

# %%
for f in folders:
    tab, rec = mg.provenance_table(f)
    save_table(tab, f"14_provenance_{mg.stem_of({'gpu': rec['device']})}", out)
    print(f"{rec['device']}: torch {rec['versions']['torch']}, CUDA {rec['versions']['cuda']};"
          f" driver {rec['datasheet']['driver'].get('driver', 'n/a')}")
    print("protocol:", "; ".join(f"{k}: {v}" for k, v in rec["protocol"].items()))
tab

# %% [markdown]
# ## FP32 kernels by class
#
# The five NeuSight classes, each kernel predicted with its tile looked up (the GPU was never
# profiled). `ratio` columns are the median of predicted / measured: below 1 the forecast is too
# fast. The paper's method (`neusight`) and the baselines beside nslib's design.

# %%
for rep in reports:
    tab = rep["fp32"]["errors"]
    save_table(tab, f"14_fp32_{mg.stem_of(rep)}", out, digits=2)
    save_figure(error_bars(tab, f"{rep['gpu']}: FP32 kernels, datasheet-only forecasts"),
                f"14_fp32_{mg.stem_of(rep)}", out)
    save_figure(predicted_vs_measured(rep["fp32"]["rows"], fp32_predictors[:3], "cls",
                                      f"{rep['gpu']}: FP32 kernels"),
                f"14_fp32_scatter_{mg.stem_of(rep)}", out)
    print(mg.reading(rep, "fp32"))
reports[0]["fp32"]["errors"].round(2)

# %% [markdown]
# ## 16-bit GEMMs and attention
#
# The 16-bit predictors were trained on the GEMM and attention tables of the 16-bit data, which
# time vLLM's kernels (attention: its paged FlashAttention builds). The collector times what
# PyTorch runs (`F.linear`, `scaled_dot_product_attention` with a contiguous KV cache), so an
# attention error here mixes the GPU with the kernel implementation: the `kernel_name` column of
# the rows says which kernels ran.

# %%
for rep in reports:
    tab = rep["tensor"]["errors"]
    save_table(tab, f"14_tensor_{mg.stem_of(rep)}", out, digits=2)
    save_figure(error_bars(tab, f"{rep['gpu']}: BF16 kernels"), f"14_tensor_{mg.stem_of(rep)}",
                out)
    print(mg.reading(rep, "tensor"))
reports[0]["tensor"]["errors"].round(2)

# %% [markdown]
# The kernels behind the rows, per table (the most frequent names and their share):

# %%
mg.kernels_run(folders[0])

# %% [markdown]
# ## Whole model steps
#
# The paper's configurations in FP32 (inference and training) and 16-bit steps of a modern
# model. Where a predictor has a calibrated interval (`nslib calibrate`), the step's interval
# is beside its forecast and the last line counts the labels it covers.

# %%
for rep in reports:
    rows = rep["steps"]["rows"]
    save_table(rows.set_index("tag"), f"14_steps_{mg.stem_of(rep)}", out, digits=1)
    save_figure(step_bars(rows, step_predictors, f"{rep['gpu']}: model steps"),
                f"14_steps_{mg.stem_of(rep)}", out)
    print(mg.reading(rep, "steps"))
reports[0]["steps"]["rows"].round(1)

# %%
reports[0]["steps"]["errors"].round(2)
