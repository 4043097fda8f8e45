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
# # 00 · The ideas behind NeuSight, on the real measurements
#
# Four ideas carry the whole method. Each gets a section here, shown on the kernels that were
# actually timed, with an **Exercise** to change and re-run:
#
# 1. **The roofline and arithmetic intensity**: a kernel is limited either by the GPU's FLOP/s
#    or by its memory bandwidth, and the ratio FLOPs / bytes says which.
# 2. **Tiles and thread blocks**: a GPU library cuts a kernel into independent tiles, one thread
#    block each, and runs at most one block per SM at a time: a *wave*.
# 3. **Wave quantisation**: latency grows in steps, one step per wave, not smoothly with size.
# 4. **Bounded utilisation extrapolates**: predicting *how much of the roofline* a wave reaches
#    (a number in (0, 1)) carries over to a faster GPU; predicting the latency itself does not.

# %% tags=["parameters"]
data = None          # NeuSight data root; None: $NSLIB_DATA or datasets/neusight
out = None           # folder for figures and tables; None: figures/interactive/ (make reproduce: figures/)
quick = False        # quick mode: fewer points in scatter plots, fewer training epochs
seed = 0
gpu = None           # GPU for sections 1-3; None: the fastest training GPU
stair_gpu = None     # GPU for the staircase; None: the one with the longest measured sweep
demo_class = "linear"   # kernel class for the extrapolation demonstration (section 4)

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from scipy.optimize import curve_fit

from nslib.kernels import measured, sizes
from nslib.kernels.clock import frame_columns, with_clock
from nslib.viz.figures import save_figure, save_table
from nslib.viz.scratch import notebook_out
from nslib.data.gpus import load_gpus
from nslib.model.inputs import resolve_gpu
from nslib.predictors import get
from nslib.explore.gpus import hypothetical_gpu

out = notebook_out(out)   # run by hand: figures/interactive/, never the tracked figures/

rng = np.random.default_rng(seed)
sample = 4000 if quick else 20000
epochs = 5 if quick else 20
gpus = load_gpus(data)
splits = measured.gpu_splits(data)
by_name = {g.name: g for g in gpus.values() if g.key == g.name.replace(" ", "_")}
train_specs = [by_name[n] for n in splits["train_gpus"]]
spec = resolve_gpu(gpu, data) if gpu else max(train_specs, key=lambda g: g.peak_gflops)
new_specs = [by_name[n] for n in splits["new_gpus"]]
fastest_new = max(new_specs, key=lambda g: g.peak_gflops) if new_specs else spec
train = {c: measured.kernel_table(c, "train", data) for c in sizes.CLASSES}
# test kernels with each GPU's clock, which nslib's GEMM issue bound needs (nslib.kernels.clock)
test = {c: with_clock(measured.kernel_table(c, "test", data), gpus) for c in sizes.CLASSES}
spec.name, fastest_new.name

# %% [markdown]
# ## 1 · The roofline and arithmetic intensity
#
# A kernel does `F` floating-point operations and moves `D` bytes between memory and the SMs.
# With a peak of `P` FLOP/s and a bandwidth of `W` bytes/s it cannot finish faster than
# `max(F / P, D / W)`. Dividing, its throughput is at most `min(P, I x W)` where the
# **arithmetic intensity** `I = F / D` (FLOP per byte). Below the **ridge point** `P / W` a
# kernel is memory-bound, above it compute-bound. An elementwise add does 1 FLOP per 12 bytes
# (two 4-byte reads, one write); an n x n x n matrix product does `2n^3` FLOPs on `12 n^2`
# bytes, so its intensity grows like `n / 6`.

# %%
sheet = pd.DataFrame([{"gpu": g.name, "peak GFLOP/s": g.peak_gflops, "bandwidth GB/s": g.mem_bw,
                       "ridge (FLOP/byte)": g.peak_gflops / g.mem_bw, "SMs": g.num_sm,
                       "training GPU": g.name in splits["train_gpus"]}
                      for g in by_name.values()]).set_index("gpu").sort_values("peak GFLOP/s")
save_table(sheet, "00_gpus", out)
sheet

# %%
example_n = [16, 64, 256, 1024, 4096]      # square GEMM sizes to place on the roofline
ex = pd.DataFrame([{"cls": "linear", "op": "linear", "B": 1.0, "M": n, "N": n, "K": n,
                    "H": np.nan} for n in example_n] +
                  [{"cls": c, "op": op, "B": 4096.0, "M": np.nan, "N": np.nan, "K": np.nan,
                    "H": 1024.0} for c, op in (("elementwise", "add"), ("elementwise", "gelu"),
                                               ("softmax", "softmax"), ("layernorm", "ln"))])
f, b = sizes.flops_bytes(ex)
ex["kernel"] = [f"GEMM {int(r.M)}^3" if r.cls == "linear" else f"{r.op} 4096x1024"
                for r in ex.itertuples()]
ex["intensity"] = f / b
ridge = spec.peak_gflops / spec.mem_bw
ex["bound on " + spec.name] = np.where(ex["intensity"] > ridge, "compute", "memory")
ex["roofline ms"] = sizes.roofline_ms(ex.assign(**{k: v for k, v in spec.columns().items()
                                                     if k != "gpu"}))
ex.set_index("kernel")[["intensity", "bound on " + spec.name, "roofline ms"]]

# %% [markdown]
# Where do the measured kernels sit? Achieved throughput (FLOPs / measured latency) against
# intensity on one GPU: nothing crosses the roof, and most kernels stay well below it.
# That gap is what every predictor has to learn.

# %%
pts = pd.concat([train[c][train[c]["gpu"] == spec.name] for c in sizes.CLASSES])
pts = pts.sample(min(sample, len(pts)), random_state=seed)
pts["I"] = pts["flops"] / pts["bytes"]
pts["achieved"] = pts["flops"] / (pts["latency_ms"] * 1e-3) / 1e9
fig, ax = plt.subplots(figsize=(7, 4.5))
for c, sub in pts.groupby("cls"):
    ax.scatter(sub["I"], sub["achieved"], s=4, alpha=0.4, label=c, linewidth=0)
xs = np.logspace(-2, 3.5, 200)
ax.plot(xs, np.minimum(spec.peak_gflops, xs * spec.mem_bw), "k-", lw=2, label="roofline")
ax.axvline(ridge, color="k", ls=":", lw=1)
ax.text(ridge * 1.1, spec.peak_gflops * 0.02, f"ridge {ridge:.1f} FLOP/B", fontsize=8)
ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)",
       ylabel="achieved GFLOP/s (measured)", title=f"measured kernels on {spec.name}")
ax.legend(markerscale=4, fontsize=8)
save_figure(fig, "00_roofline", out)

# %% [markdown]
# **Exercise:** add sizes to `example_n` and find the smallest square GEMM that is
# compute-bound on this GPU. Then set `gpu = "Tesla P4"` in the parameters cell (or
# `"H100"`) and re-run: how far does the ridge point move, and why does a faster GPU need
# *larger* kernels to be busy?

# %% [markdown]
# ## 2 · Tiles, thread blocks and waves
#
# cuBLAS computes a GEMM's `M x K` output in tiles of `tm x tk` (the tile size is in the
# kernel's name, e.g. `ampere_sgemm_32x32_...`). Each tile is one thread block that reads a
# `tm x N` strip of the input and an `N x tk` strip of the weight. There are
# `ceil(M / tm) * ceil(K / tk)` blocks, and a GPU with `S` SMs runs them `S` at a time:
# `waves = ceil(blocks / S)`. Below, a real measured kernel, its tiles coloured by the wave
# they run in: the last wave may be almost empty, and still costs a whole wave.

# %%
pick_waves = 3            # pick a measured kernel with this many waves
lin = train["linear"][(train["linear"]["gpu"] == spec.name) & (train["linear"]["blocks"] <= 600)]
cand = lin[lin["waves"] == pick_waves].copy()
cand["tail"] = cand["blocks"] - (cand["waves"] - 1) * spec.num_sm   # blocks in the last wave
k = cand.sort_values(["tail", "blocks"]).iloc[0] if len(cand) else lin.iloc[0]
gx, gy = int(np.ceil(k["K"] / k["tile_k"])), int(np.ceil(k["M"] / k["tile_m"]))
pd.Series({"kernel name": k["kernel_name"], "M x N x K": f"{k.M:.0f} x {k.N:.0f} x {k.K:.0f}",
           "tile (tm x tk)": f"{k.tile_m:.0f} x {k.tile_k:.0f}", "blocks": int(k["blocks"]),
           "launch grid (x, y)": f"{k.grid_x}, {k.grid_y}", "SMs": spec.num_sm,
           "waves": int(k["waves"]), "blocks in last wave": int(k["tail"]) if "tail" in k else "",
           "measured ms": k["latency_ms"]})

# %%
wave = (np.arange(gy)[:, None] * gx + np.arange(gx)[None, :]) // spec.num_sm
fig, ax = plt.subplots(figsize=(min(12, 2 + gx * 0.25), min(6, 1.5 + gy * 0.35)))
cmap = plt.get_cmap("viridis", int(wave.max()) + 1)
im = ax.imshow(wave, cmap=cmap, extent=[0, gx * k["tile_k"], gy * k["tile_m"], 0],
               aspect="auto", vmin=-0.5, vmax=wave.max() + 0.5)
for x in range(gx + 1):
    ax.axvline(x * k["tile_k"], color="w", lw=0.5)
for y in range(gy + 1):
    ax.axhline(y * k["tile_m"], color="w", lw=0.5)
ax.add_patch(plt.Rectangle((0, 0), k["K"], k["M"], fill=False, ec="r", lw=2))
ax.set(xlabel="output columns (K)", ylabel="output rows (M)",
       title=f"{int(k.M)} x {int(k.K)} output (red) in {int(k.tile_m)} x {int(k.tile_k)} "
             f"tiles: {int(k.blocks)} blocks on {spec.num_sm} SMs = {int(k.waves)} waves")
fig.colorbar(im, ax=ax, ticks=range(int(wave.max()) + 1), label="wave")
save_figure(fig, "00_tiles", out)

# %% [markdown]
# **Exercise:** set `pick_waves = 1` or `5` and re-run. Then imagine the same kernel on a GPU
# with 132 SMs (an H100): how many waves would it need, and how full would the last one be?
# (`np.ceil(k.blocks / 132)`.)

# %% [markdown]
# ## 3 · Wave quantisation: latency is a staircase
#
# If every wave takes about the same time, latency is a fixed cost (launch, start-up) plus
# `waves x (time of one wave)`: flat while
# extra blocks still fit into idle SMs, then a jump when a new wave starts. The test kernels
# contain sweeps of batched GEMMs with fixed `M, N, K` and a growing batch `B` (so the block
# count grows in even steps with an unchanged tile): the measured latency against blocks, with
# vertical lines at multiples of the SM count.

# %%
bmm = test["bmm"]
series = []
for name, sub in bmm.groupby("gpu"):
    for mnk, s in sub.groupby(["M", "N", "K"]):
        if s["tile_m"].nunique() == 1 and s["tile_k"].nunique() == 1:
            series.append({"gpu": name, "M": mnk[0], "N": mnk[1], "K": mnk[2],
                           "points": int((s["waves"] <= 8).sum()),
                           "training GPU": name in splits["train_gpus"]})
series = pd.DataFrame(series).sort_values(["points", "training GPU"], ascending=False,
                                          kind="stable")
sgpu = resolve_gpu(stair_gpu, data).name if stair_gpu else series["gpu"].iloc[0]
chosen = series[series["gpu"] == sgpu].head(3)
sm = by_name[sgpu].num_sm if sgpu in by_name else int(bmm.loc[bmm["gpu"] == sgpu, "num_sm"].iloc[0])
fig, ax = plt.subplots(figsize=(8, 4.2))
xmax = 0
for r in chosen.itertuples():
    s = bmm[(bmm["gpu"] == sgpu) & (bmm["M"] == r.M) & (bmm["N"] == r.N) & (bmm["K"] == r.K)]
    s = s[s["waves"] <= 8].sort_values("blocks")
    # least squares: latency = fixed + waves x per_wave
    per_wave, fixed = np.polyfit(s["waves"], s["latency_ms"], 1)
    line = ax.plot(s["blocks"], s["latency_ms"], "o", ms=5,
                   label=f"bmm M,N,K = {r.M:.0f},{r.N:.0f},{r.K:.0f} "
                         f"(tile {s.tile_m.iloc[0]:.0f}x{s.tile_k.iloc[0]:.0f}): "
                         f"{fixed * 1e3:.0f} us + {per_wave * 1e3:.0f} us per wave")[0]
    bx = np.arange(1, s["blocks"].max() + 1)
    ax.step(bx, fixed + np.ceil(bx / sm) * per_wave, where="post", color=line.get_color(),
            lw=1, alpha=0.7)
    xmax = max(xmax, s["blocks"].max())
for w in range(1, int(np.ceil(xmax / sm)) + 1):
    ax.axvline(w * sm, color="0.5", ls=":", lw=1)
ax.set(xlabel=f"thread blocks (dotted: multiples of {sm} SMs)", ylabel="measured latency (ms)",
       title=f"wave quantisation on {sgpu} (lines: a fixed cost + waves x time per wave)")
ax.legend(fontsize=8)
save_figure(fig, "00_waves_staircase", out)
chosen

# %% [markdown]
# Steps, not a slope: a kernel of 109 blocks on 108 SMs costs about as much as one of 216.
# This is why NeuSight predicts the time of *one wave* and multiplies by the number of waves.
#
# How much of the roofline does a wave reach? With few waves the GPU is partly idle (start-up,
# the ragged last wave), with many it settles at a steady fraction. NeuSight's utilisation law
# `u = gamma * (1 - alpha / waves)` captures exactly that shape: below, the measured fraction
# of the roofline of all linear kernels on one GPU against their waves, with the law fitted.

# %%
lk = train["linear"][train["linear"]["gpu"] == spec.name].copy()
lk["u"] = (lk["flops"] / (lk["latency_ms"] * 1e-3)) / (
    np.minimum(lk["peak_gflops"] * 1e9, lk["flops"] / lk["bytes"] * lk["mem_bw"] * 1e9))
bins = np.unique(np.round(np.logspace(0, np.log10(lk["waves"].max()), 25)))
lk["wbin"] = pd.cut(lk["waves"], np.r_[0.5, bins[1:] - 0.5, np.inf], labels=False)
med = lk.groupby("wbin").agg(waves=("waves", "median"), u=("u", "median"), n=("u", "size"))
med = med[med["n"] >= 5]
law = lambda w, gamma, alpha: gamma * (1 - alpha / w)  # noqa: E731
(gamma, alpha), _ = curve_fit(law, med["waves"], med["u"], p0=(0.8, 0.5),
                              bounds=([0, 0], [1, 1]))
fig, ax = plt.subplots(figsize=(7, 4))
sub = lk.sample(min(sample, len(lk)), random_state=seed)
ax.scatter(sub["waves"], sub["u"], s=3, alpha=0.25, color="0.5", linewidth=0, label="kernels")
ax.plot(med["waves"], med["u"], "o", color="C0", label="median per wave bin")
ws = np.logspace(0, np.log10(lk["waves"].max()), 100)
ax.plot(ws, law(ws, gamma, alpha), "C3-", lw=2,
        label=f"u = {gamma:.2f} (1 - {alpha:.2f} / waves)")
ax.set(xscale="log", ylim=(0, 1), xlabel="waves", ylabel="achieved / roofline",
       title=f"utilisation of linear kernels on {spec.name}")
ax.legend(fontsize=8)
save_figure(fig, "00_utilisation", out)

# %% [markdown]
# **Exercise:** set `stair_gpu = "Tesla T4"` (40 SMs) or `"Tesla P100-PCIE-16GB"` and
# re-run the staircase: do the steps move with the SM count? Then change the class of the
# utilisation plot from `"linear"` to `"bmm"`: is its steady fraction `gamma` higher or lower?

# %% [markdown]
# ## 4 · Why a bounded utilisation extrapolates to a faster GPU
#
# Train two small networks of the same size on the same kernels of the *older* training GPUs
# only, keeping the fastest training GPU back:
#
# - **bounded** (NeuSight's idea, here nslib's bounded predictor `nslib`): the network outputs
#   efficiencies in (0, 1) of the kernel's roofline terms (its inputs are the tile's shape and
#   the SM count; peak and bandwidth act only through the roofline), so a faster GPU has a
#   faster roofline, the prediction speeds up with it and can never beat it;
# - **unbounded**: a network on the paper's four tile features (tile FLOPs and bytes per SM,
#   normalised by the GPU's per-SM peak and bandwidth) predicts the latency directly. Nothing ties its output to
#   the GPU's speed, so on a GPU faster than any it saw it can only answer with the speeds it
#   knows (its inputs are clipped to the training range, as nslib's are).
#
# Then test both on held-out kernels: of the GPUs they were fitted on, of the fastest training
# GPU (kept back here), and of the newer GPUs nobody trained on.

# %%
small = dict(seed=seed, epochs=epochs, layers=3, hidden=64, batch=256)
kept_back = max(train_specs, key=lambda g: g.peak_gflops).name
fit_on = train[demo_class][train[demo_class]["gpu"] != kept_back]
bounded = get("nslib", **small).fit(fit_on, progress=False)
unbounded = get("mlp", **small).fit(fit_on, progress=False)
ev = test[demo_class]
role = {n: "fitted on" for n in splits["train_gpus"]}
role.update({kept_back: "kept back (faster)", **{n: "new GPU" for n in splits["new_gpus"]}})
rows = []
for name, sub in ev.groupby("gpu"):
    for label, model in (("bounded (nslib)", bounded), ("unbounded MLP", unbounded)):
        pred = model.predict(sub)
        rows.append({"gpu": name, "role": role.get(name, "other"), "predictor": label,
                     "MAPE %": 100 * float(np.mean(np.abs(pred / sub["latency_ms"] - 1))),
                     "median pred / measured": float(np.median(pred / sub["latency_ms"]))})
err = pd.DataFrame(rows)
table = err.pivot_table(index=["role", "gpu"], columns="predictor",
                        values=["MAPE %", "median pred / measured"])
save_table(table, "00_extrapolation", out, digits=2)
table

# %% [markdown]
# Read the table by role. On the GPUs they were fitted on, the two networks are in the same
# range (the unbounded one is just as flexible). On the faster GPUs the bounded network stays
# at that level, while the unbounded one's error grows: with the full profile (20 epochs) it
# is off by hundreds of percent or more on the kept-back A100 and the new GPUs, predicting them
# several times too slow (median ratio well above 1); the barely-trained quick profile shows
# the same tendency, weaker. Part of a device's speed does reach the unbounded network, through
# the per-SM normalised features, so how badly it fails depends on the GPU and the training.
#
# The right panel below shows the mechanism without any measurement: one kernel, on
# hypothetical GPUs with the FP32 peak and bandwidth of the fastest new GPU multiplied by up
# to 16 (built with `nslib.explore.gpus.hypothetical_gpu`). The bounded prediction follows the
# roofline down, a constant factor above it; the unbounded one lags far behind, because
# nothing in it says that twice the FLOP/s should halve the time.

# %%
fig, axes = plt.subplots(1, 3, figsize=(16, 4.3))
ax = axes[0]
piv = err.pivot_table(index="gpu", columns="predictor", values="MAPE %")
piv = piv.loc[sorted(piv.index, key=lambda g: (role.get(g) != "fitted on", g))]
piv.plot.bar(ax=ax, rot=30)
for i, g in enumerate(piv.index):
    if role.get(g) != "fitted on":
        ax.get_xticklabels()[i].set_color("C3")
ax.set(ylabel=f"{demo_class} MAPE (%, log scale)", xlabel="", yscale="log",
       title="held-out kernels (red: not fitted on)")
ax.tick_params(axis="x", labelsize=7)
for lab in ax.get_xticklabels():
    lab.set_ha("right")

ax = axes[1]
sub = ev[ev["gpu"] == fastest_new.name]
sub = sub.sample(min(sample, len(sub)), random_state=seed)
for label, model, c in (("bounded (nslib)", bounded, "C0"), ("unbounded MLP", unbounded, "C1")):
    ax.scatter(sub["latency_ms"], model.predict(sub), s=5, alpha=0.5, color=c, label=label)
lim = [sub["latency_ms"].min() / 2, sub["latency_ms"].max() * 2]
ax.plot(lim, lim, "k--", lw=1)
ax.set(xscale="log", yscale="log", xlabel="measured ms", ylabel="predicted ms",
       title=f"{demo_class} kernels on {fastest_new.name} (never trained on)")
ax.legend(markerscale=3, fontsize=8)

ax = axes[2]
cand = ev[ev["gpu"] == fastest_new.name].sort_values("latency_ms")
one = cand.iloc[[len(cand) // 2]]         # a kernel of median latency
scales = [1, 1.5, 2, 3, 4, 6, 8, 12, 16]
curves = {"bounded (nslib)": [], "unbounded MLP": [], "roofline": []}
for s in scales:
    g = hypothetical_gpu(fastest_new, peak_gflops=fastest_new.peak_gflops * s,
                         mem_bw=fastest_new.mem_bw * s)
    row = one.drop(columns=[c for c in ("tile_m", "tile_k", "tile") if c in one]).assign(
        **{c: v for c, v in frame_columns(g).items() if c != "gpu"})
    curves["bounded (nslib)"].append(bounded.predict(row)[0])
    curves["unbounded MLP"].append(unbounded.predict(row)[0])
    curves["roofline"].append(sizes.roofline_ms(row)[0])
for label, ys in curves.items():
    ax.plot(scales, ys, "o-" if label != "roofline" else "k:", label=label)
r = one.iloc[0]
ax.set(xscale="log", yscale="log", xlabel=f"peak and bandwidth x {fastest_new.name}",
       ylabel="predicted ms",
       title=f"one {demo_class} kernel ({r.M:.0f}x{r.N:.0f}x{r.K:.0f}) on faster GPUs"
       if demo_class in sizes.GEMM_CLASSES else f"one {demo_class} kernel on faster GPUs")
ax.legend(fontsize=8)
fig.tight_layout()
save_figure(fig, "00_extrapolation", out)

# %% [markdown]
# **Exercise:** set `demo_class = "bmm"` or `"elementwise"` and re-run section 4. Then raise
# `epochs` (in the set-up cell) and check whether a better-trained *unbounded* network closes
# the gap on the new GPUs, or only on the old ones.
#
# ## Where to go next
# Notebook 01 looks at all the measurements and the plain roofline's error, 02 trains and
# compares the kernel predictors, 04 and 05 predict whole models, and 08 is an interactive
# explorer for GPUs that do not exist yet.
