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
# # 08 · GPU explorer: what would this model cost on that GPU?
#
# The question behind NeuSight is practical: *before* buying or renting a GPU, how long will
# one inference or training step of my model take on it? The forecast needs only the GPU's
# datasheet, so it also answers questions about GPUs that do not exist: what if the H100 had
# twice the memory bandwidth? This notebook asks one such question non-interactively (so a
# papermill run writes its figures and tables), then opens the interactive explorer
# (`nslib.explore.ui`, over the plain functions of `nslib.explore.whatif`), where GPUs, a
# hypothetical GPU, the model (or a pasted HuggingFace config), batch, sequence length, mode
# and predictor can be changed freely.

# %% tags=["parameters"]
data = None        # NeuSight data root; None: $NSLIB_DATA or datasets/neusight
out = None         # folder for figures and tables; None: figures/interactive/ (make reproduce: figures/)
quick = False      # quick profile: the quick-trained predictor, a shorter what-if sweep
seed = 0
gpus = ["H100", "A100 80GB", "A100-PCIE-40GB"]   # names or aliases of GPUs in the data
model = "gpt2_large"   # a config name in data/DLmodel_configs, a JSON path or a dict
batch = 4
seq = 1024
mode = "inf"           # "inf" (one forward pass) or "train" (forward + backward)
predictor = "nslib"
what_if = {"mem_bw": 2.0}   # factors on the first GPU's datasheet for a hypothetical GPU
serving_model = "Qwen/Qwen3-32B"   # the serving view: a model with a config in the project
serving_gpus = ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA B200"]  # need Bf16FLOPs
serving_tp = 2
intervals = True   # calibrate the intervals first (leave-one-GPU-out folds; cached)

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

from nslib.viz.figures import save_figure, save_table
from nslib.viz.scratch import notebook_out
from nslib.model.inputs import resolve_gpu
from nslib.explore.gpus import hypothetical_gpu
from nslib.explore.plots import plot_scenario
from nslib.explore.ranges import explorer_ranges
from nslib.explore.ui import build_explorer
from nslib.explore.whatif import scenario
from nslib.model.step import Step
from nslib.data.settings import Settings
from nslib.predictors.intervals import calibration

out = notebook_out(out)   # run by hand: figures/interactive/, never the tracked figures/
settings = Settings(data=data, quick=quick, seed=seed)  # made once, passed down
step = Step(batch, seq, mode)

specs = [resolve_gpu(g, data) for g in gpus]
base = specs[0]
custom = hypothetical_gpu(base, **{f: getattr(base, f) * k for f, k in what_if.items()})
factors = [0.5, 1, 2, 4] if quick else [0.25, 0.5, 1, 1.5, 2, 3, 4, 8]
ranges = explorer_ranges(data)
if intervals:  # the forecasts' 80% intervals (notebook 13); without it only a cached one shows
    calibration(predictor, data, quick, seed, progress=True)
custom.name

# %% [markdown]
# ## The GPUs in question
# Datasheet numbers of the chosen GPUs and of the hypothetical one, against the range of the
# five training GPUs. Anything outside that range is an extrapolation: the explorer says so.

# %%
sheet = pd.DataFrame([{"gpu": g.name, **{c: v for c, v in g.columns().items() if c != "gpu"}}
                      for g in specs + [custom]]).set_index("gpu")
sheet.loc["training GPUs: min"] = [ranges["gpu"][c][0] for c in sheet.columns]
sheet.loc["training GPUs: max"] = [ranges["gpu"][c][1] for c in sheet.columns]
save_table(sheet, "08_gpus", out, digits=0)
sheet

# %% [markdown]
# ## One scenario: step time, where it goes, and the largest kernels
# `scenario` traces the model once, predicts every kernel on every GPU and sums. The right
# panel places the largest kernels (identical per-layer launches grouped) under each GPU's
# roofline: the GEMMs sit near the flat compute roof, the elementwise ops on the bandwidth
# slope, which is why the hypothetical GPU's extra bandwidth buys the time it buys.

# %%
res = scenario(specs + [custom], model, step, predictor, settings=settings)
summary = res["summary"].set_index("gpu")
summary["vs first"] = summary["e2e_ms"] / summary["e2e_ms"].iloc[0]
save_table(summary[["e2e_ms", "fw_ms", "bw_ms", "n_kernels", "vs first", "in_training_range"]],
           "08_scenario", out, digits=2)
save_table(res["per_class"], "08_per_class", out, digits=2)
fig = plot_scenario(res)
save_figure(fig, "08_scenario", out)
summary[["e2e_ms", "fw_ms", "bw_ms", "vs first"]].round(2)

# %%
top = res["top_kernels"]
top[top["gpu"] == base.name][["kernel_class", "op", "shape", "count", "pred_ms", "total_ms",
                              "share", "intensity", "achieved_gflops",
                              "roofline_gflops"]].round(3)

# %% [markdown]
# ## What the explorer warns about
# The predictors learned from five older GPUs and from kernels of limited sizes. A GPU whose
# datasheet lies outside the training GPUs, or kernels larger (or with more waves) than any
# training kernel, still get a forecast, but it is an extrapolation; the list below is what
# the explorer shows in its message area.

# %%
display(Markdown("\n".join(f"- {w}" for w in res["warnings"]) or "No warnings."))

# %% [markdown]
# ## What-if sweep: scaling one datasheet number at a time
# Each point is a hypothetical GPU: the first GPU with its bandwidth, or its FP32 peak, scaled.
# Physically, more bandwidth or more FLOP/s can never make a step slower: a memory-bound model
# keeps gaining from bandwidth, and once the GEMMs dominate only more FLOP/s helps. The sweep is
# therefore also a check of the predictor: the cell after the plot says whether its forecast
# respects that, and which kernel classes do not.

# %%
rows = []
for field in ("mem_bw", "peak_gflops"):
    for k in factors:
        g = hypothetical_gpu(base, name=f"{field} x{k}", **{field: getattr(base, field) * k})
        r = scenario([g], model, step, predictor, settings=settings)
        rows.append({"scaled": field, "factor": k, "e2e_ms": r["summary"]["e2e_ms"].iloc[0],
                     **r["per_class"].iloc[0].to_dict()})
sweep = pd.DataFrame(rows).fillna(0.0)
save_table(sweep.set_index(["scaled", "factor"]), "08_what_if", out, digits=2)
fig, ax = plt.subplots(figsize=(6, 3.8))
for field, sub in sweep.groupby("scaled"):
    ax.plot(sub["factor"], sub["e2e_ms"], "o-", label=f"{field} scaled")
ax.axvline(1, color="0.6", lw=0.8, ls="--")
ax.set(xscale="log", yscale="log", xlabel=f"factor on {base.name}'s datasheet",
       ylabel="predicted step time (ms)", title=f"{res['params']['model']} {mode}, "
       f"batch {batch}, seq {seq}")
ax.legend()
save_figure(fig, "08_what_if", out)
sweep.set_index(["scaled", "factor"]).round(1)

# %%
notes = []
classes = [c for c in sweep.columns if c not in ("scaled", "factor", "e2e_ms")]
for field, sub in sweep.groupby("scaled"):
    sub = sub.sort_values("factor")
    rising = [c for c in ["e2e_ms"] + classes if (np.diff(sub[c].to_numpy()) >
                                                   1e-3 * sub[c].abs().max()).any()]
    if not rising:
        notes.append(f"- more `{field}` never makes the step slower: physical.")
    else:
        what = ", ".join(f"`{c}`" for c in rising)
        notes.append(f"- **more `{field}` makes some predictions slower** ({what} rise with the "
                     f"factor somewhere in {sub['factor'].min():g}x-{sub['factor'].max():g}x): "
                     f"the {predictor} predictor extrapolates non-physically along this "
                     f"datasheet number; trust the direction of such a what-if only where the "
                     f"curve falls.")
display(Markdown("\n".join(notes)))

# %% [markdown]
# ## The interactive explorer
# Select GPUs (ctrl/shift-click for several), tick *add a hypothetical GPU* and move the
# sliders (factors on the base GPU's datasheet), pick a model or paste a HuggingFace
# `config.json` into the text box, and change batch, sequence length, mode or predictor. Each
# change re-predicts; with the model traced and the predictor loaded an update takes well
# under a second. Errors (a malformed config, a sequence longer than the model allows) and
# range warnings appear as text above the charts. A predictor other than nslib's design
# (`nslib`, the default) is trained on first use (minutes; NeuSight as published, `neusight`,
# takes longer); `quick` uses the quick profile.

# %%
explorer = build_explorer(gpus=gpus, model=model, step=step, predictor=predictor,
                          hypothetical=what_if, settings=settings)
explorer

# %% [markdown]
# ## Serving: tokens per second and time to first token
# The same question for an LLM served by an engine (vLLM, SGLang or TensorRT-LLM defaults):
# output tokens per second per GPU and TTFT against the number of requests in flight, for
# GPUs with a BF16 peak in their datasheet and a hypothetical one (the first GPU with twice
# its bandwidth). Where the KV cache is full the rest of the requests queue, and TTFT climbs.
# How far these forecasts hold is notebook 12's subject.

# %%
from nslib.explore.gpus import hypothetical_gpu as _hyp
from nslib.explore.serving import serving_curves
from nslib.explore.serving_ui import build_serving_explorer
from nslib.model.serving import Workload
from nslib.model.inputs import resolve_gpu
from nslib.viz.serving_plots import throughput_curves

first = resolve_gpu(serving_gpus[0])
served = serving_curves(serving_gpus + [_hyp(first, mem_bw=2 * first.mem_bw)], serving_model,
                        Workload(tp=serving_tp), most=64 if quick else 256, settings=settings)
for n in served["notes"]:
    print(n)
fig = throughput_curves(served["curves"])
save_figure(fig, "08_serving", out)
served["curves"].groupby("gpu", sort=False).tail(1).set_index("gpu")[
    ["concurrency", "running", "ttft_ms", "tpot_ms", "tokens_per_s_gpu"]].round(1)

# %% [markdown]
# The interactive serving view: pick GPUs, the model, the engine, the tensor-parallel degree,
# prompt and output lengths and the largest concurrency; tick *add a hypothetical GPU* to
# scale a GPU's bandwidth, BF16 peak or memory.

# %%
serving_view = build_serving_explorer(gpus=serving_gpus, model=serving_model,
                                      workload=Workload(tp=serving_tp), settings=settings,
                                      hypothetical={"mem_bw": 2.0})
serving_view
