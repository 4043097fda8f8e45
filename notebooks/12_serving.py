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
# # 12 · Serving an LLM on a GPU nobody measured: TTFT, TPOT, tokens/s
#
# "How many tokens per second, at what time to first token, would this model serve on that
# GPU?" A serving engine (vLLM, SGLang, TensorRT-LLM) runs *iterations*: each pushes the prompt
# tokens of new requests and one token of every decoding request through the model. nslib
# prices an iteration with the same 16-bit trace and kernel predictors as
# `nslib predict --dtype bf16` (GEMMs at the iteration's token count, FlashAttention per request
# group, tensor-parallel all-reduces over the datasheet's link), then schedules the requests as
# the engine does (`nslib.model.serving`). This notebook checks the forecast against
# aiconfigurator's measured serving sample (H100 rows; other GPUs' rows are kept back) with a
# roofline forecast beside it, then forecasts GPUs that only have a datasheet.

# %% tags=["parameters"]
mixed = None     # 16-bit data root; None: $NSLIB_MIXED or datasets/mixed
data = None      # NeuSight data root (the FP32-trained vector predictors)
out = None       # figures and tables; None: figures/interactive/ (make reproduce: figures/)
sample = None    # serving sample CSV; None: the one in the 16-bit data
quick = False    # quick profile: short predictor training and a subsample of rows, for tests
forecast_model = "Qwen/Qwen3-32B"   # a HuggingFace id with a config in the project, or a path
forecast_gpus = ["H100", "NVIDIA H200", "NVIDIA B200", "A100-SXM4-80GB", "NVIDIA L40S"]
forecast_tp = 2
forecast_isl, forecast_osl = 1024, 256
forecast_engine = "vllm"
intervals = True   # calibrate the intervals first (leave-one-GPU-out folds; cached)

# %%
import os
import warnings

import numpy as np
import pandas as pd

from nslib.data.serving_sample import serving_rows
from nslib.data.settings import Settings
from nslib.evaluation.serving_eval import error_table, predict_sample, unpriced, waiting_requests
from nslib.explore.serving import serving_curves
from nslib.model.serving import FRAMEWORKS, Workload
from nslib.predictors.intervals import calibration, tensor_calibration
from nslib.viz.figures import save_figure, save_table
from nslib.viz.scratch import notebook_out
from nslib.viz.serving_plots import error_by, serving_scatter, throughput_curves

out = notebook_out(out)   # run by hand: figures/interactive/, never the tracked figures/
if mixed:
    os.environ["NSLIB_MIXED"] = str(mixed)
if data:
    os.environ["NSLIB_DATA"] = str(data)
warnings.filterwarnings("ignore", message=".*outside the training.*")

if intervals:   # the 16-bit predictors' and the vector kernels' calibrations (notebook 13)
    tensor_calibration("nslib", quick, progress=True)
    calibration("nslib", data, quick, progress=True)
rows = serving_rows(sample)
if quick:   # two concurrencies per engine keep the test run short
    keep = rows["batch_size"].isin([16, 64]) & rows["tp_size"].isin([2, 4])
    rows = rows[keep | (rows["reason"] != "")]
print(f"{len(rows)} rows: {(rows['reason'] == '').sum()} priced")
engines = pd.DataFrame([vars(f) for f in FRAMEWORKS.values()]).set_index("name")
save_table(engines, "12_engine_defaults", out)
engines

# %% [markdown]
# ## What is not priced, and why
# Every row is counted: rows in another precision (FP8, FP4: no predictors for them yet),
# disaggregated deployments and GPUs without a datasheet are listed by reason, never dropped.

# %%
missing = unpriced(rows)
save_table(missing.set_index("reason"), "12_unpriced", out)
missing

# %% [markdown]
# ## TTFT and TPOT against the measurements
# One `StepCost` per model, GPU and tensor-parallel degree; each group's rows are one
# vectorised `serve` call. `roofline` is the same scheduling over roofline kernel times (the
# datasheet's peaks), the baseline a forecast from the datasheet must beat. With the
# intervals calibrated, `nslib_ttft_covered` and `nslib_tpot_covered` give the share of
# measurements inside the 80% intervals (the schedule rerun with every part of an iteration
# at its bound). Those bound the GPU's work, not how the benchmark's requests arrive, which no
# forecast knows: `nslib_ttft_in_arrivals` is the share of measured TTFTs between the TTFT of
# a request arriving alone into the steady decode load and that of every request arriving at
# once (their prompts back to back), the range the arrival pattern alone spans.

# %%
pred = predict_sample(rows, quick=quick, progress=True)
table = error_table(pred)
save_table(table.set_index(["framework", "model_path", "gpu"]), "12_serving_errors", out)
table.round(2)

# %%
fig = serving_scatter(pred)
save_figure(fig, "12_serving_scatter", out)

# %% [markdown]
# ## The same rows as if nobody had measured the GPU
# The 16-bit GEMM and attention predictors above trained on every measured GPU, the sample's
# own among them. A GPU nobody measured has no kernels in training: here each GPU's rows are
# priced by predictors trained without its kernels (the leave-one-GPU-out folds of
# `nslib eval-kernels --dtype bf16`, cached), the view the kept-back GPUs' rows will take.

# %%
held = predict_sample(rows, methods=("nslib",), quick=quick, progress=True, held_out=True)
held_table = error_table(held, methods=("nslib",))
save_table(held_table.set_index(["framework", "model_path", "gpu"]), "12_serving_held_out", out)
held_table.round(2)

# %% [markdown]
# ## Where the error lies: concurrency and prompt length
# TPOT is an iteration's time, mostly the GEMMs at the decode batch plus the KV-cache read; it
# holds across engines. TTFT depends on how the engine admits prompts: SGLang runs prompts
# before decodes in budget-sized batches (waves), so whatever arrives merges into a wave;
# vLLM and TensorRT-LLM mix them into decode iterations, where the arrival pattern places
# TTFT between the two ends above, and the forecast takes their geometric mean. Per
# concurrency and per prompt length:

# %%
by_conc = error_table(pred, by=("framework", "batch_size"))
by_isl = error_table(pred, by=("framework", "isl"))
save_table(by_conc.set_index(["framework", "batch_size"]), "12_errors_by_concurrency", out)
save_table(by_isl.set_index(["framework", "isl"]), "12_errors_by_isl", out)
fig = error_by(pred, "batch_size")
save_figure(fig, "12_errors_by_concurrency", out)
by_conc.round(1)

# %%
print("median predicted / measured TTFT per engine and prompt length:")
pred.assign(r=pred["nslib_ttft_ms"] / pred["silicon_ttft_ms"]).pivot_table(
    index="framework", columns="isl", values="r", aggfunc="median").round(2)

# %% [markdown]
# ## An engine that keeps a request waiting
# At a fixed concurrency, a request's TTFT should not depend on how many tokens it will
# generate. In a closed loop (each client sends its next request when the last one ends)
# it does only through waiting: a request that waits for another to finish waits one
# interval between completions, `osl x TPOT / concurrency`. The slope of the measured TTFT
# against that interval, over rows that differ only in the output length, counts the
# requests that wait (Little's law): 0 when none, 1 when one always does. Read off the
# measurements alone, per engine and concurrency:

# %%
slopes = waiting_requests(pred)
save_table(slopes, "12_waiting_requests", out)
slopes.round(2)

# %% [markdown]
# vLLM's TTFT does not move with the output length (slope 0). TensorRT-LLM's moves by one
# interval at concurrency 8-32: one request always waits, so the engine defaults above serve
# `concurrency - 1` at once for it (`waiting`) and the queue term that prices a full KV cache
# prices that wait. Beyond 32 its slopes scatter (the TTFTs there hold more than the schedule
# explains). SGLang's waves come back together, so their TTFT is the waves', not a queue.

# %% [markdown]
# ## Forecast: GPUs with only a datasheet
# Output tokens per second per GPU and TTFT against concurrency, one curve per GPU, for
# `forecast_model` on `forecast_tp` GPUs with the engine defaults of `forecast_engine`. A GPU
# whose KV cache cannot hold every request queues the rest (the knee in TTFT). GPUs whose
# datasheet lacks the BF16 peak are left out with a note.

# %%
conc = np.unique(np.round(np.geomspace(1, 256, 12 if quick else 40)).astype(int))
served = serving_curves(forecast_gpus, forecast_model,
                        Workload(forecast_isl, forecast_osl, forecast_engine, forecast_tp),
                        concurrency=conc, settings=Settings(quick=quick))
print("\n".join(served["notes"]))
curves = served["curves"]
save_table(curves.set_index(["gpu", "concurrency"]), "12_forecast", out)
fig = throughput_curves(curves)
save_figure(fig, "12_forecast", out)
curves.pivot_table(index="concurrency", columns="gpu", values="tokens_per_s_gpu").round(0)

# %% [markdown]
# ## Reading
# - **TPOT** is an iteration of the engine: the decode batch's GEMMs and KV-cache read, plus
#   the prompt tokens of arriving requests mixed in (vLLM, TensorRT-LLM) or the prefill batches
#   that stall decodes (SGLang). It holds within the bar for every engine above, and well
#   ahead of the roofline, which misses the GEMMs' and attention's real efficiencies.
# - **TTFT** holds for SGLang, whose waves follow from its documented policy (prompts first,
#   in budget-sized batches, so arrivals merge into waves). For the mixed engines the
#   schedule leaves TTFT between a request arriving alone and every request at once, and the
#   forecast is their geometric mean (the least worst-case log error over that range), plus,
#   for TensorRT-LLM, the wait of the one request it keeps waiting (the section above). That
#   holds for vLLM and for TensorRT-LLM up to concurrency 32; beyond, TensorRT-LLM's measured
#   TTFTs hold more than the schedule gives (the sample records neither the arrivals nor
#   the front end). These forms were chosen on these rows; the kept-back GPUs' rows are
#   their test.
# - Rows with the KV cache full (Qwen3-32B on one H100) are queueing: TTFT is the wait for a
#   slot, set by how much memory the engine leaves to the cache.
