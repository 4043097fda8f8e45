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
# # 09 · 16-bit models on current GPUs: BF16 GEMMs, FlashAttention, layers
#
# The paper's question is FP32 with eager attention. Today's question is 16-bit: a BF16 GEMM
# runs on the tensor cores at 10-30x the FP32 peak, and attention is one FlashAttention kernel.
# This notebook trains the 16-bit kernel predictors on public measurements of four current GPUs
# (aiconfigurator's BF16 GEMM and FlashAttention tables), scores them **leave-one-GPU-out**
# (each GPU predicted by a predictor that never saw it), checks whole transformer layers against
# vidur's fp16 per-op timings, and forecasts GPUs that only have a datasheet.

# %% tags=["parameters"]
mixed = None     # 16-bit data root; None: $NSLIB_MIXED or datasets/mixed
data = None      # NeuSight data root (nslib's FP32 vector predictors price norms and adds)
out = None       # folder for figures and tables; None: figures/interactive/ (make reproduce: figures/)
predictors = ["roofline", "roofline_eff", "xgboost", "mlp", "nslib"]
seed = 0
quick = False    # quick profile: a subsample of each table and short training, for tests
forecast_model = "configs/llama3_8b.json"  # HuggingFace config of the forecast model
forecast_steps = [["inf", 1, 2048], ["inf", 16, 512], ["train", 1, 2048]]  # mode, batch, seq
property_rows = 3000  # measured rows per kind in the property checks

# %%
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from nslib.data import mixed_data
from nslib.viz.figures import save_figure, save_table
from nslib.viz.scratch import notebook_out
from nslib.data.gpus import load_mixed_gpus
from nslib.evaluation.kernel_level import logo_frame, mape_table
from nslib.predictors.mixed_training import KINDS, kind_table
from nslib.viz.plots import logo_heatmap, pred_vs_measured_scatter

out = notebook_out(out)   # run by hand: figures/interactive/, never the tracked figures/

gpus = load_mixed_gpus(mixed)
sheets = mixed_data.gpu_frame(gpus).set_index("gpu")
measured = {k: mixed_data.measured_gpus(kind_table(k, quick, mixed)) for k in KINDS}
sheets["measured"] = [", ".join(k for k in KINDS if g in measured[k]) or "datasheet only"
                      for g in sheets.index]
save_table(sheets, "09_datasheets", out)
sheets

# %% [markdown]
# ## The measurements
# Rows per GPU and kind. A GPU whose tables are dropped into the data folder joins every table
# below; a GPU with only a datasheet is forecast at the end.

# %%
counts = pd.DataFrame({k: kind_table(k, quick, mixed)["gpu"].value_counts() for k in KINDS})
counts

# %% [markdown]
# ## BF16 GEMMs, leave-one-GPU-out
# Every predictor is trained on three GPUs and predicts the fourth, for each GPU in turn. The
# roofline uses the datasheet's dense tensor-core peak and bandwidth; `roofline_eff` divides it
# by one efficiency fitted on the training GPUs (what analytic tools do); `xgboost` and `mlp`
# learn log latency from log shapes and datasheet figures; `nslib` (nslib's design) learns a
# bounded utilisation of waves of tiles, NeuSight's idea.

# %%
logo = {k: logo_frame(k, predictors, seed=seed, quick=quick, mixed=mixed) for k in KINDS}
gemm_table = mape_table(logo["gemm"]).T
save_table(gemm_table, "09_gemm_logo", out)
gemm_table.round(1)

# %%
save_figure(logo_heatmap(gemm_table, "BF16 GEMM, leave-one-GPU-out MAPE (%)"),
            "09_gemm_logo", out)

# %% [markdown]
# ## FlashAttention, leave-one-GPU-out
# Prefill (causal self-attention over the prompt) and decode (one new token per sequence against
# the KV cache), per GPU and per phase.

# %%
att_table = mape_table(logo["attention"]).T
save_table(att_table, "09_attention_logo", out)
att_by_phase = mape_table(logo["attention"], by=("gpu", "phase")).T
save_table(att_by_phase, "09_attention_logo_by_phase", out)
att_table.round(1)

# %%
att_by_phase.round(1)

# %% [markdown]
# ## Predicted against measured (nslib's bounded predictor, each GPU unseen)

# %%
for kind in KINDS:
    if "pred_nslib" in logo[kind]:
        fig = pred_vs_measured_scatter(logo[kind], "pred_nslib", seed=seed)
        fig.axes[0].set_title(f"{kind}: leave-one-GPU-out")
        save_figure(fig, f"09_{kind}_pred_vs_measured", out)

# %% [markdown]
# ## More hardware never makes a kernel slower?
# The forecast of a GPU nobody measured must move the way hardware does. Each check takes
# `property_rows` measured rows per kind (shapes and datasheets as measured), gives one
# datasheet figure 1.5x or 3x more and counts the rows whose forecast did not grow (nslib's
# predictors trained on every measured GPU). More SMs are SMs of the same kind, their peaks
# with them; a faster clock raises the peaks with it. Bandwidth and clock hold on every row
# by construction; the SM count holds where the MLP's inputs do not move with it (the GEMM
# tries the launches a GPU with fewer SMs would run); the L2 size does not, since each MLP
# reads the working set over the L2 size and may give resident bytes a lower rate than DRAM.

# %%
from nslib.evaluation.tensor_properties import tensor_property_checks
from nslib.predictors import trained
from nslib.data.settings import Settings

fitted = Settings(seed=seed, quick=quick, mixed=mixed, progress=False)
props = {}
for kind in KINDS:
    rows = kind_table(kind, quick, mixed)
    rows = rows.sample(min(property_rows, len(rows)), random_state=seed).reset_index(drop=True)
    props[kind] = tensor_property_checks(trained("nslib", fitted, kind=kind), rows)
props = pd.concat(props, names=["kind"]).reset_index(level=0)
save_table(props, "09_property_checks", out, digits=2)
props.round(2)

# %% [markdown]
# ## Whole layers against vidur's fp16 timings
# Every non-attention op of a real transformer layer (RMSNorm, QKV projection, rotary
# embedding, output projection, gated MLP, SiLU-and-mul, residual add) built from the model's
# shape and priced the way `nslib predict --dtype fp16` prices a traced model: GEMMs by the
# 16-bit GEMM predictor trained **without the GPU being checked**, vector kernels by nslib's
# FP32 predictors (`nslib`) at their 16-bit bytes. Median |error| over the layers with at least 256
# tokens: of the summed layer and of each op class.

# %%
from nslib.evaluation.layer_check import layer_predictions, layer_report, layer_sums

layers = mixed_data.layer_table(mixed)
if quick:  # every 8th token count of each (model, TP): the same layers in every quick run
    layers = layers[layers["num_tokens"].rank(method="dense").astype(int) % 8 == 0]
checked = layer_predictions(layers, quick=quick, mixed=mixed, data=data, leave_out=True)
layer_table = layer_report(checked)
save_table(layer_table, "09_layer_check", out)
layer_table.round(1)

# %% [markdown]
# Which way each op class is off: the median of predicted over measured time (1 = right; below 1
# = predicted too fast).

# %%
from nslib.evaluation.layer_check import OP_CLASS

big = checked[checked["num_tokens"] >= 256]
direction = (big["pred_ms"] / big["latency_ms"]).groupby(
    [big["gpu"], big["layer_op"].map(OP_CLASS)]).median().unstack()
save_table(direction, "09_layer_ratio_by_class", out, digits=2)
direction.round(2)

# %% [markdown]
# The two benchmarks on the same GEMM: every layer GEMM of vidur's tables whose shape (tokens,
# reduction, width) is also a row of the BF16 GEMM table of the same GPU, vidur's time over the
# table's (fp16 and BF16 run at one tensor-core rate on these GPUs). Above 1, vidur's harness
# times the same GEMM slower than the table the GEMM predictor learns from: that part of the
# GEMM ratio above belongs to the measurements, not to the predictor.

# %%
from nslib.evaluation.layer_check import source_agreement

agreement = source_agreement(mixed)
save_table(agreement, "09_source_agreement", out, digits=2)
agreement.round(2)

# %% [markdown]
# Reading the layer tables: vLLM runs RMSNorm, rotary embedding and SiLU-and-mul as its own fused
# kernels, which reach a fraction of the bandwidth PyTorch's kernels (the ones the vector
# predictors learned from) reach, so those classes come out too fast; the residual add, a plain
# PyTorch kernel, does not. The GEMMs carry most of a layer's time. Their ratio above is the
# GEMM predictor's own bias on a GPU it never saw (the GEMM tables above) times the inverse of
# the benchmarks' disagreement: a GPU whose GEMMs the predictor over-prices can look right
# against the slower harness, and one it under-prices looks worse.

# %%
sums = layer_sums(checked)
fig, ax = plt.subplots(figsize=(7, 4))
sns.lineplot(data=sums, x="num_tokens", y="error_pct", hue="gpu", estimator="median",
             errorbar=("pi", 50), ax=ax)
ax.axhline(0, color="k", lw=0.8)
ax.set(xscale="log", xlabel="tokens in the batch", ylabel="layer time error (%)",
       title="summed non-attention layer time: median and middle half")
save_figure(fig, "09_layer_error_by_tokens", out)

# %% [markdown]
# ## Forecasts from a datasheet alone
# The GPUs of the data folder with no measurements are predicted from their datasheets by the
# predictors trained on every measured GPU: a Llama-3-8B inference (prefill) and training step in
# BF16, beside the measured GPUs for scale. Nothing here was measured; the leave-one-GPU-out
# tables above say how far to trust it.

# %%
from nslib.data.settings import Settings
from nslib.model.predict import predict_model
from nslib.model.step import Step

unseen = [g for g in gpus.values() if not any(g.name in measured[k] for k in KINDS)]
rows = []
for g in sorted(gpus.values(), key=lambda g: g.bf16_gflops or 0):
    if g.bf16_gflops is None:
        continue
    for mode, batch, seq in forecast_steps:
        _, s = predict_model(g, forecast_model, Step(batch, seq, mode, "bf16"),
                             settings=Settings(data=data, quick=quick))
        rows.append({"gpu": g.name, "datasheet only": g in unseen, "mode": mode,
                     "batch": batch, "seq": seq, "ms": s["e2e_ms"],
                     "tokens/s": batch * seq / s["e2e_ms"] * 1e3})
forecast = pd.DataFrame(rows).set_index(["mode", "batch", "seq", "gpu"]).sort_index()
save_table(forecast, "09_forecast_llama3_8b", out)
forecast.round(1)

# %%
fig, ax = plt.subplots(figsize=(8, 3.5))
plot = forecast.reset_index()
plot["step"] = plot["mode"] + " b" + plot["batch"].astype(str) + " s" + plot["seq"].astype(str)
plot["gpu"] = plot["gpu"].where(~plot["datasheet only"], plot["gpu"] + " (datasheet only)")
sns.barplot(data=plot, y="gpu", x="tokens/s", hue="step", ax=ax)
ax.set(xlabel="predicted tokens per second (BF16)", ylabel="")
save_figure(fig, "09_forecast_llama3_8b", out)
