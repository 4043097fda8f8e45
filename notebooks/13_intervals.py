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
# # 13 · How far to trust a forecast: calibrated intervals
#
# A forecast for a GPU nobody measured is one number; this notebook attaches an interval to
# it and checks how often the interval holds on GPUs the predictor never saw. The recipe
# (`nslib.predictors.intervals`): hold each training GPU out in turn, let the predictor trained
# without it price its kernels, and keep the log ratios `r = log(predicted / measured)`. Per
# kernel class, the `a/2` and `1 - a/2` quantiles of `r` (split-conformal ranks, every GPU
# weighing the same) bound a new kernel's error. A model step adds its classes' bounds
# together (comonotone: one GPU's kernels err together). The checks below are *nested*: each
# held-out GPU against the calibration of the others, so no GPU grades its own interval.

# %% tags=["parameters"]
data = None      # NeuSight data root; None: $NSLIB_DATA or datasets/neusight
mixed = None     # 16-bit data root; None: $NSLIB_MIXED or datasets/mixed
kernelbench = None  # KernelBench timings folder; None: $NSLIB_KERNELBENCH or datasets/kernelbench
out = None       # figures and tables; None: figures/interactive/ (make reproduce: figures/)
quick = False    # quick profile (tests)
seed = 0
predictor = "nslib"
coverage = 0.8
nominal = [0.5, 0.6, 0.7, 0.8, 0.9, 0.95]   # coverages of the calibration curve
modes = ["inf", "train"]

# %%
import warnings

import numpy as np
import pandas as pd

from nslib.evaluation.interval_eval import (e2e_summary, e2e_table, kernel_table,
                                            tensor_kernel_table)
from nslib.predictors.intervals import (calibration, logo_residuals, nested_coverage)
from nslib.viz.figures import save_figure, save_table
from nslib.viz.interval_plots import coverage_curve, e2e_intervals
from nslib.viz.scratch import notebook_out

out = notebook_out(out)   # run by hand: figures/interactive/, never the tracked figures/
warnings.filterwarnings("ignore", message=".*outside the training.*")

cal = calibration(predictor, data, quick, seed, coverage, progress=True)
bounds = pd.DataFrame({c: {"lower x": np.exp(-hi), "upper x": np.exp(-lo), "kernels": cal.n[c]}
                       for c, (lo, hi) in cal.bounds.items()}).T
save_table(bounds, "13_bounds", out, digits=3)
print(f"{100 * coverage:.0f}% kernel intervals of {predictor}: a kernel predicted at p lies "
      f"in [p x lower, p x upper]; held out in turn: {', '.join(cal.gpus)}")
bounds

# %% [markdown]
# ## Per class, on GPUs the calibration never saw
# Achieved coverage and half-width (% of the prediction) of the nested check, the worst
# GPU's coverage, and two baselines: the prediction plus or minus the other GPUs' mean APE
# (what a reader of an error table would assume), and the plain spread of the predictor's
# ensemble (from its lowest member's price to its highest, for the classes trained as
# ensembles; `ensemble_*` columns). The members learn the same data and err together on a
# GPU they never saw, so their spread says little about the error.

# %%
table = kernel_table(predictor, coverage, data, quick, seed)
save_table(table, "13_kernel_coverage", out)
table.round(1)

# %%
res = logo_residuals(predictor, data, quick, seed)
per_gpu = nested_coverage(res, coverage).pivot_table(index="cls", columns="gpu",
                                                     values="covered")
save_table(per_gpu, "13_coverage_per_gpu", out)
per_gpu.round(1)

# %% [markdown]
# The 16-bit kernels (BF16 GEMMs and FlashAttention, which price `--dtype bf16` forecasts and
# serving) have intervals of their own, calibrated the same way on the leave-one-GPU-out
# residuals of the 16-bit data's measured GPUs; the same nested check, each of those GPUs
# against the calibration of the others.

# %%
table16 = tensor_kernel_table("nslib", coverage, quick, seed, mixed)
save_table(table16, "13_kernel_coverage_16bit", out)
table16.round(1)

# %% [markdown]
# One GPU's kernels err together, so its coverage can sit far from the nominal one: the
# guarantee of split-conformal prediction is over GPUs drawn like the held-out ones, and five
# GPUs are a small sample of GPUs. The curve below asks the same at other coverages.

# %%
curve = pd.concat([nested_coverage(res, q).groupby("cls")["covered"].mean().rename(100 * q)
                   for q in nominal], axis=1)
long = curve.stack().rename("covered").reset_index().rename(columns={"level_1": "nominal"})
fig = coverage_curve(long)
save_figure(fig, "13_coverage_curve", out)
save_table(curve, "13_coverage_curve", out)
curve.round(1)

# %% [markdown]
# ## A second family of GPUs: KernelBench's campaigns
# The same intervals (calibrated on the NeuSight training GPUs alone) around KernelBench's
# level-1 kernels, timed by another harness on GPUs never trained on (the T4 excepted,
# measured again), each interval around the kernel's GPU time with the campaign's per-call
# cost added to both bounds. Few kernels per class and GPU: read the counts. Where the call is
# mostly the host's (the elementwise problems), the interval of the kernel is narrow against
# the call and says nothing of the host.

# %%
from nslib.data.paths import DataNotFoundError
from nslib.data.settings import Settings
from nslib.evaluation.interval_eval import kernelbench_coverage

try:
    kb_cov = kernelbench_coverage(predictor, coverage, Settings(data=data, quick=quick,
                                                               seed=seed, progress=False),
                                  kernelbench)
except DataNotFoundError as e:
    kb_cov = None
    print(f"KernelBench timings not found; this section is skipped. {e}")
if kb_cov is not None:
    kb_table = kb_cov["covered"].unstack("gpu").assign(
        **{"mean over GPUs": kb_cov["covered"].groupby("cls").mean()})
    save_table(kb_table, "13_kernelbench_coverage", out)
    display(kb_cov.round(1))
kb_table.round(1) if kb_cov is not None else None

# %% [markdown]
# ## End to end, on the GPUs never trained on
# Every measured step of the new GPUs with its forecast and interval. Whether the interval
# covers the measurement is the check a user cares about.

# %%
steps = pd.concat([e2e_table(m, predictor, coverage, data, quick, seed).assign(mode=m)
                   for m in modes], ignore_index=True)
summary = pd.concat({m: e2e_summary(steps[steps["mode"] == m]) for m in modes})
save_table(summary, "13_e2e_coverage", out)
fig = e2e_intervals(steps)
save_figure(fig, "13_e2e_intervals", out)
summary.round(1)

# %%
lines = [f"- {cls}: {r.covered:.0f}% covered (nested; worst GPU {r.worst_gpu:.0f}%), "
         f"+-{r.half_width:.0f}% wide; the +-MAPE band covers {r.mape_band_covered:.0f}%"
         + (f", the ensemble's spread {r.ensemble_covered:.0f}% at +-{r.ensemble_half_width:.1f}%"
            if pd.notna(r.get("ensemble_covered")) else "")
         for cls, r in table.iterrows()]
lines += [f"- end to end, {m} on {g}: {r.covered:.0f}% of {int(r.labels)} labels covered, "
          f"median +-{r.median_half_width:.0f}%" for (m, g), r in summary.iterrows()]
print("\n".join(lines))
