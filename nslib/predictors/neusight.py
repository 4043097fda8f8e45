"""NeuSight: per-class MLPs predicting how much of the roofline a kernel reaches, bounded by it.

For each kernel class an MLP maps log2 features of the kernel (and of the GPU) to a few raw
outputs that a *law* (:func:`wave_ms`) turns into time. The paper's wave laws
(``paper``: ``u = gamma * (1 - alpha / num_waves)``; ``overhead``; ``additive``) give the
utilisation u in (0, 1) of one wave of tiles and

    t = num_waves * (num_sm * tile_FLOPs) / (roofline_throughput * u)     (ms).

The kernel laws build the time from physical terms of the datasheet, each divided by a learned
efficiency in (0, 1): ``series`` (GEMMs) ``c + max(compute / gamma, bytes / (delta * bandwidth))``
and ``stream`` (memory-bound classes) ``c + bytes / (gamma * bandwidth) + bytes / (kappa *
SM peak)``, never below the kernel's roofline. The defaults (:data:`CLASS_DEFAULTS`) are the
kernel laws, chosen on leave-one-GPU-out error (DECISIONS.md). Training minimises the
symmetric percentage error of the per-wave latency. Kernels without a parsed tile (unprofiled
GPUs, traced models) take the tile of the nearest measured training kernel
(:mod:`nslib.kernels.tiles`); softmax kernels pack several rows per block (:class:`RowPacking`). A
class may train an :class:`Ensemble` of MLPs from different seeds; their utilisations are
averaged.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import sys

import numpy as np
import pandas as pd

from nslib.kernels import sizes
from nslib.data.paths import data_root
from nslib.kernels.tiles import TileLookup
from nslib.predictors.base import Predictor, by_class



FEATURES = ("compute", "load", "dram_footprint", "l2_footprint")  # the paper's four
DEFAULT_FEATURES = ("compute", "load")
# Class defaults, chosen on leave-one-GPU-out error over the training GPUs among designs that
# keep the physical properties of nslib.evaluation.extrapolation (evidence: DECISIONS.md beside this file).
# The MLP sees the kernel's shape and the GPU's SM count only (clipped to the training range);
# peak, bandwidth and their ratio enter through the law's physical terms, so a datasheet
# outside the training range moves time the way the hardware would, not an MLP input.
GEMM_DEFAULTS = {"features": ("tile_m", "tile_k", "reduction", "num_sm"), "form": "series",
                 "clip": True}
VECTOR_DEFAULTS = {"features": ("tile_kb", "blocks", "num_sm"), "form": "stream"}
CLASS_DEFAULTS = {"elementwise": dict(VECTOR_DEFAULTS), "softmax": dict(VECTOR_DEFAULTS),
                  "layernorm": dict(VECTOR_DEFAULTS), "bmm": dict(GEMM_DEFAULTS),
                  "linear": dict(GEMM_DEFAULTS)}


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one class's MLP (the paper's: 8 x 512, AdamW, batch 128).

    ``features``: names for :func:`tile_features`; ``form``: the utilisation law of
    :func:`wave_ms`; ``pack_rows``: pack softmax rows into blocks (:class:`RowPacking`).
    ``lr`` per step, cosine-annealed to 0 over ``epochs``; ``batch`` in kernels.
    ``val``: how the epoch to keep is chosen: ``random`` (a random ``val_frac`` of the kernels)
    or ``gpu`` (the training GPU with the highest FP32 peak held out whole). ``ensemble``:
    MLPs trained from different seeds (and validation splits) whose utilisations are averaged
    (damps the seed-to-seed spread). ``clip``: clip the standardised inputs to the training
    range (a GPU with more SMs than any trained on is treated as the largest one seen).
    ``tiles``: ``parsed`` (each training kernel's own tile; looked up on a new GPU) or
    ``nominal`` (trained and predicted with the tile most training GPUs ran for the dims,
    :class:`nslib.kernels.tiles.TileLookup` with ``gpu_free``).
    """

    layers: int = 4
    hidden: int = 128
    lr: float = 1e-3
    weight_decay: float = 1e-4
    batch: int = 256
    epochs: int = 60
    val_frac: float = 0.2
    features: tuple = DEFAULT_FEATURES
    form: str = "overhead"
    pack_rows: bool = True
    val: str = "random"
    ensemble: int = 1
    clip: bool = True
    tiles: str = "parsed"


def paper_config(cls: str, data=None) -> dict:
    """The published hyper-parameters of ``cls`` from ``data/predictor/configs/MLP_WAVE_*``."""
    name = {"bmm": "BMM", "linear": "LINEAR", "elementwise": "VEC", "softmax": "SOFTMAX",
            "layernorm": "LN"}[cls]
    raw = json.loads((data_root(data) / "data" / "predictor" / "configs" /
                      f"MLP_WAVE_{name}.json").read_text())
    return {"layers": raw["num_layers"], "hidden": raw["hidden_size"], "lr": raw["lr"],
            "batch": raw["train_batch"]}


def _check_config(cls: str, cfg: dict, bounded: bool) -> None:
    """Clear errors for a class config the predictor cannot train."""
    if cfg["form"] not in FORMS:
        raise ValueError(f"{cls}: unknown NeuSight form {cfg['form']!r}; known: {FORMS}")
    if cfg["tiles"] not in ("parsed", "nominal"):
        raise ValueError(f"{cls}: tiles must be 'parsed' or 'nominal', got {cfg['tiles']!r}")
    if not bounded and cfg["form"] in KERNEL_LAWS:
        raise ValueError(f"{cls}: the unbounded MLP predicts whole-kernel latency; the kernel "
                         f"laws {KERNEL_LAWS} are for the bounded NeuSight")


def tile_features(frame: pd.DataFrame, features=FEATURES) -> np.ndarray:
    """The (n, len(features)) log2 per-SM-normalised features of method.md section 4.

    ``compute``: tile FLOPs / (peak TFLOP/s per SM); ``load``: tile MB / (GB/s per SM);
    ``dram_footprint``: waves * tile MB / (memory MB per SM); ``l2_footprint``:
    waves * tile MB / (L2 MB per SM, times 1024 as in the paper). Extras: ``waves``,
    ``tile_m``, ``tile_k``, ``aspect`` (tm / tk), ``reduction`` (N) for GEMMs, ``balance``
    (tile FLOP/byte over the GPU's peak FLOP/s per byte/s), ``num_sm``, ``fill``
    (blocks / (waves * num_sm), in (0, 1]); GPU-independent ``tile_kb`` (KiB a block
    moves), ``blocks`` and ``row`` (H of vector ops). float64.
    """
    sm = frame["num_sm"].to_numpy(float)
    tile_mb = frame["tile_bytes"].to_numpy(float) / 2**20
    waves = frame["waves"].to_numpy(float)
    cols = {
        "compute": lambda: frame["tile_flops"].to_numpy(float)
        / (frame["peak_gflops"].to_numpy(float) / 1000 / sm),
        "load": lambda: tile_mb / (frame["mem_bw"].to_numpy(float) / sm),
        "dram_footprint": lambda: waves * tile_mb / (frame["mem_gb"].to_numpy(float) * 1024 / sm),
        "l2_footprint": lambda: waves * tile_mb / (frame["l2_mb"].to_numpy(float) * 1024 / sm),
        "waves": lambda: waves,
        # GPU-independent tile shape (GEMMs; NaN-free only where the class has the dims)
        "tile_m": lambda: frame["tile_m"].to_numpy(float),
        "tile_k": lambda: frame["tile_k"].to_numpy(float),
        # tile rows over columns (GEMMs only: NaN for other classes)
        "aspect": lambda: frame["tile_m"].to_numpy(float) / frame["tile_k"].to_numpy(float),
        "reduction": lambda: frame["N"].to_numpy(float),
        # tile arithmetic intensity over the machine balance (peak / bandwidth): > 1 compute-bound
        "balance": lambda: (frame["tile_flops"].to_numpy(float) / frame["tile_bytes"].to_numpy(float))
        / (frame["peak_gflops"].to_numpy(float) / frame["mem_bw"].to_numpy(float)),
        "num_sm": lambda: sm,
        # GPU-independent kernel descriptors: bytes a block moves, blocks launched, row length
        "tile_kb": lambda: frame["tile_bytes"].to_numpy(float) / 1024,
        "blocks": lambda: frame["blocks"].to_numpy(float),
        "row": lambda: frame["H"].to_numpy(float),
        # how full the waves are on average: blocks / (waves * num_sm), in (0, 1]
        "fill": lambda: frame["blocks"].to_numpy(float) / (waves * sm),
    }
    unknown = set(features) - set(cols)
    if unknown:
        raise ValueError(f"unknown NeuSight feature(s) {sorted(unknown)}; known: {sorted(cols)}")
    return np.log2(np.column_stack([cols[f]() for f in features]))


def roofline_wave_ms(frame: pd.DataFrame) -> np.ndarray:
    """Time of one full wave at the roofline, ms: ``num_sm * tile_FLOPs / roofline``."""
    return frame["num_sm"].to_numpy(float) * frame["tile_flops"].to_numpy(float) / \
        frame["roofline_tput"].to_numpy(float) * 1e3


class RowPacking:
    """Rows per thread block of softmax kernels, learned from the launch grids of training kernels.

    PyTorch's ``softmax_warp_forward`` (rows up to 1024 elements) packs several rows into one
    block (4 rows of more than 128 elements, more for shorter rows), while
    ``cunn_SoftMaxForward`` runs one row per block. Which one runs depends on the row length H
    only, so an unprofiled GPU takes the rows per block of the training row length nearest in
    log2 H. ``apply`` turns the one-row tiles of :func:`nslib.kernels.sizes.add_features` into packed
    tiles: tile FLOPs and bytes times the rows per block, blocks ``ceil(B / rows)``.
    """

    CLASSES = ("softmax",)

    def __init__(self, log2_h=None, rows=None):
        self.log2_h = np.asarray([] if log2_h is None else log2_h, float)
        self.rows = np.asarray([] if rows is None else rows, float)

    def fit(self, frame: pd.DataFrame) -> "RowPacking":
        sub = frame[frame["cls"].isin(self.CLASSES)]
        grid = (sub["grid_x"] * sub["grid_y"] * sub["grid_z"]).to_numpy(float) if len(sub) else []
        ok = np.isfinite(grid) & (np.asarray(grid) > 0) if len(sub) else []
        if len(sub) and np.any(ok):
            rows = np.ceil(sub["B"].to_numpy(float)[ok] / np.asarray(grid)[ok])
            tab = pd.Series(rows).groupby(np.log2(sub["H"].to_numpy(float)[ok])).median()
            self.log2_h, self.rows = tab.index.to_numpy(float), 2.0 ** np.round(np.log2(tab.to_numpy()))
        return self

    def rows_per_block(self, H: np.ndarray) -> np.ndarray:
        """Rows per block for row lengths ``H`` (nearest training H in log2; 1 if none)."""
        if not len(self.log2_h):
            return np.ones(len(H))
        x = np.log2(np.asarray(H, float))
        i = np.clip(np.searchsorted(self.log2_h, x), 1, len(self.log2_h) - 1) \
            if len(self.log2_h) > 1 else np.zeros(len(x), int)
        if len(self.log2_h) > 1:
            i = np.where(np.abs(self.log2_h[i - 1] - x) <= np.abs(self.log2_h[i] - x), i - 1, i)
        return self.rows[i]

    def apply(self, frame: pd.DataFrame) -> pd.DataFrame:
        """A copy of a featured frame with packed softmax tiles (other rows unchanged)."""
        mask = frame["cls"].isin(self.CLASSES).to_numpy()
        if not mask.any() or not len(self.log2_h):
            return frame
        out = frame.copy()
        sub = out.loc[mask]
        r = self.rows_per_block(sub["H"].to_numpy(float))
        blocks = np.ceil(sub["B"].to_numpy(float) / r)
        out.loc[mask, "tile"] = sub["H"].to_numpy(float) * r
        out.loc[mask, "tile_flops"] = sub["tile_flops"].to_numpy(float) * r
        out.loc[mask, "tile_bytes"] = sub["tile_bytes"].to_numpy(float) * r
        out.loc[mask, "blocks"] = blocks
        out.loc[mask, "waves"] = np.ceil(blocks / sub["num_sm"].to_numpy(float))
        return out

    def get_state(self) -> dict:
        return {"log2_h": self.log2_h, "rows": self.rows}

    @classmethod
    def from_state(cls, state: dict | None) -> "RowPacking":
        if not state:
            return cls()
        return cls(np.asarray(state["log2_h"], float), np.asarray(state["rows"], float))


FORMS = ("paper", "overhead", "additive", "stream", "series")
# raw MLP outputs each law needs
OUTPUTS = {"paper": 2, "overhead": 2, "additive": 2, "stream": 3, "series": 3}
# Scale of the additive and stream forms' fixed cost: exp(raw) * 10 us, so raw = 0 is a
# typical launch.
ADDITIVE_MS = 0.01
# Scale of the stream form's SM-side rate: bytes an SM moves per FLOP of its FP32 peak
# (exp(raw) times this; 0.1 is ~18 GB/s for an SM of 180 GFLOP/s).
KAPPA = 0.1
CONTEXT = ("base", "waves", "mem_ms", "sm_ms", "comp_ms", "roof_ms")
# laws whose time is built from whole-kernel terms and bounded by the kernel's own roofline
KERNEL_LAWS = ("stream", "series")


def wave_context(frame: pd.DataFrame) -> np.ndarray:
    """Per kernel, the (n, 6) float64 quantities the laws of :func:`wave_ms` combine.

    ``base``: one wave at the roofline, ms (:func:`roofline_wave_ms`); ``waves``;
    ``mem_ms``: the kernel's bytes at the memory bandwidth, ms; ``sm_ms``: its bytes at one
    byte per FLOP of the FP32 peak of the SMs it occupies (``min(blocks, num_sm)``), ms: the
    time scale of how fast the SMs themselves can issue memory traffic; ``comp_ms``: the
    waves of tiles at the FP32 peak, ms (wave-quantised compute time); ``roof_ms``: the
    kernel's roofline, ``max(FLOPs / peak, bytes / bandwidth)``, ms.
    """
    sm = frame["num_sm"].to_numpy(float)
    nbytes = frame["bytes"].to_numpy(float)
    active = np.minimum(frame["blocks"].to_numpy(float), sm)
    per_sm = frame["peak_gflops"].to_numpy(float) * 1e9 / sm
    waves = frame["waves"].to_numpy(float)
    cols = [roofline_wave_ms(frame), waves,
            nbytes / (frame["mem_bw"].to_numpy(float) * 1e9) * 1e3,
            nbytes / (active * per_sm) * 1e3,
            waves * frame["tile_flops"].to_numpy(float) / per_sm * 1e3,
            sizes.roofline_ms(frame)]
    return np.column_stack(cols).astype(float)


class _NumpyOps:
    """The few array functions the laws use, for numpy arrays (torch has them by name)."""

    exp, maximum, stack = staticmethod(np.exp), staticmethod(np.maximum), staticmethod(np.stack)

    @staticmethod
    def sigmoid(x: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-x))


def _ops(raw):
    """``torch`` for a tensor (training needs its gradients), else numpy: the laws are
    written once over either, so prediction never needs torch."""
    torch = sys.modules.get("torch")  # a tensor means torch is imported already
    return torch if torch is not None and isinstance(raw, torch.Tensor) else _NumpyOps


def _one_wave_ms(raw, ctx, form: str):
    """Per-wave ms of one member from its raw outputs (see :func:`wave_ms`)."""
    xp = _ops(raw)
    base, waves = ctx[:, 0], ctx[:, 1]
    gamma = xp.sigmoid(raw[:, 1].clip(-30, 30))  # < 1 in float64 even for unclipped inputs
    if form == "paper":
        return base / (gamma * (1 - xp.sigmoid(raw[:, 0].clip(-30, 30)) / waves))
    if form == "overhead":
        return base * (waves + xp.exp(raw[:, 0].clip(-20, 20))) / (gamma * waves)
    if form == "additive":
        return base / gamma + ADDITIVE_MS * xp.exp(raw[:, 0].clip(-20, 20)) / waves
    if form == "stream":
        kappa = KAPPA * xp.exp(raw[:, 2].clip(-20, 20))
        total = ADDITIVE_MS * xp.exp(raw[:, 0].clip(-20, 20)) + ctx[:, 2] / gamma + \
            ctx[:, 3] / kappa
        return xp.maximum(total, ctx[:, 5]) / waves
    if form == "series":
        # a GEMM streams its minimal traffic at no less than half the bandwidth (why: DECISIONS.md)
        delta = 0.5 + 0.5 * xp.sigmoid(raw[:, 2].clip(-30, 30))
        total = ADDITIVE_MS * xp.exp(raw[:, 0].clip(-20, 20)) + \
            xp.maximum(ctx[:, 4] / gamma, ctx[:, 2] / delta)
        return xp.maximum(total, ctx[:, 5]) / waves
    raise ValueError(f"unknown NeuSight form {form!r}; known: {FORMS}")


def wave_ms(raw, ctx, form: str):
    """Predicted ms of one wave (float64) from the MLP's raw outputs; ``ctx``: the kernels'
    :func:`wave_context`. The kernel takes ``waves`` times this. ``raw`` and ``ctx`` are both
    numpy arrays (prediction) or both torch tensors (training).

    The utilisation ``u = base / wave_ms`` is in (0, 1) under the wave laws (``paper``,
    ``overhead``, ``additive``), and the kernel laws (``stream``, ``series``) are bounded by
    the kernel's own roofline (``roof_ms``; a partial last wave does not move a full wave's
    bytes), so no prediction beats the roofline. ``paper``: ``u = gamma * (1 - alpha / waves)``, alpha and gamma
    sigmoids. ``overhead``: ``u = gamma * waves / (waves + a)``, gamma a sigmoid and
    ``a = exp(raw)`` a fixed cost in units of waves (latency = (waves + a) * wave_time /
    gamma). ``additive``: latency = waves * wave_time / gamma + c with ``c = exp(raw) * 10 us``
    a fixed cost in time, not in waves: a launch costs about the same whatever the GPU's
    bandwidth, where the ``overhead`` law scales it with the wave time (1 / bandwidth for
    memory-bound ops) and a slow-memory GPU unlike the training ones got launch costs of a
    millisecond. ``stream`` (memory-bound classes): latency = c + bytes / (gamma * bandwidth)
    + bytes / (kappa * FP32 peak of the occupied SMs): the memory system and the SMs' own
    issue rate (Little's law: an SM keeps a bounded number of bytes in flight) are two
    ceilings in series; a GPU whose memory is slow next to its SMs is DRAM-bound, one whose
    memory is fast next to few or slow SMs is SM-bound. gamma, kappa and c depend on the
    kernel's shape and the SM count (an MLP input, clipped to the training range), so for a
    given tile, bandwidth and peak enter only through these terms and more of either never
    makes a kernel slower (SM count and L2: checked, :mod:`nslib.evaluation.extrapolation`; a
    never-profiled GPU's looked-up tile can change with its datasheet). ``series`` (GEMMs): latency = c + max(compute / gamma,
    bytes / (delta * bandwidth)), delta in (0.5, 1), compute the waves of tiles at the FP32
    peak: the tile
    pipeline overlaps loads with math, so the slower of the two sets the pace, and a GPU
    with slow memory next to its peak turns GEMMs of low intensity memory-bound instead of
    extrapolating an MLP input. An ensemble averages its members' u.
    """
    k = OUTPUTS[form] if form in OUTPUTS else 2
    if raw.shape[1] > k:
        base = ctx[:, 0]
        u = _ops(raw).stack([base / _one_wave_ms(raw[:, j:j + k], ctx, form)
                             for j in range(0, raw.shape[1], k)]).mean(0)
        return base / u
    return _one_wave_ms(raw, ctx, form)


def make_mlp(n_in: int, layers: int, hidden: int, n_out: int):
    """A torch MLP (for training): ``layers`` x (Linear(hidden), ReLU), then Linear(n_out)."""
    from torch import nn
    mods, d = [], n_in
    for _ in range(layers):
        mods += [nn.Linear(d, hidden), nn.ReLU()]
        d = hidden
    mods.append(nn.Linear(d, n_out))
    return nn.Sequential(*mods)


def mlp_weights(model) -> list[np.ndarray]:
    """A trained :func:`make_mlp`'s ``[W0, b0, W1, b1, ...]`` as float32 numpy arrays."""
    return [p.detach().cpu().numpy().copy() for p in model.parameters()]


def mlp_forward(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """The MLP of ``weights`` (:func:`mlp_weights`) on inputs ``x`` (n, d), in float64 numpy:
    ReLU between the linear layers, none after the last."""
    h = np.asarray(x, float)
    for i in range(0, len(weights), 2):
        h = h @ weights[i].T.astype(float) + weights[i + 1].astype(float)
        if i + 2 < len(weights):
            h = np.maximum(h, 0.0)
    return h


def smape(pred, target):
    """Symmetric absolute percentage error (a fraction, mean over the batch)."""
    return (2 * (pred - target).abs() / (pred.abs() + target.abs())).mean()


class NeuSight(Predictor):
    """Tile/wave-bounded MLP predictor, one MLP per kernel class."""

    name = "neusight"
    description = "NeuSight: per-class MLP of wave utilisation, bounded by the roofline"
    bounded = True

    def __init__(self, seed: int = 0, configs: dict | None = None, **common):
        """``configs`` maps a class to TrainConfig fields; ``common`` applies to every class.

        Precedence: ``configs[cls]`` over ``common`` over :data:`CLASS_DEFAULTS` over TrainConfig.
        The unbounded subclass predicts whole-kernel latency, so it needs the size-dependent
        footprints: it defaults to the paper's four :data:`FEATURES` instead.
        """
        self.seed = seed
        base = CLASS_DEFAULTS if self.bounded else {c: {"features": FEATURES} for c in sizes.CLASSES}
        self.configs = {c: asdict(TrainConfig(**{**base.get(c, {}), **common,
                                                  **(configs or {}).get(c, {})}))
                        for c in sizes.CLASSES}
        for c, cfg in self.configs.items():
            _check_config(c, cfg, self.bounded)
        # per class, each ensemble member's [W0, b0, W1, b1, ...] (float32 numpy): the
        # forward pass is numpy, so a cached prediction never imports torch
        self.models: dict[str, list[list[np.ndarray]]] = {}
        self.norm: dict[str, tuple[np.ndarray, ...]] = {}  # mean, std, clip lo, clip hi
        self.tiles = TileLookup()
        self.nominal = TileLookup(gpu_free=True)
        self.packing = RowPacking()
        self.history: dict[str, list] = {}

    # ----- the model of one class
    def _outputs(self, cls: str, frame: pd.DataFrame) -> np.ndarray:
        """Raw MLP outputs (n, outputs x members), float64: the members side by side."""
        z = self._inputs(cls, tile_features(frame, self.configs[cls]["features"]))
        return np.concatenate([mlp_forward(w, z) for w in self.models[cls]], axis=1)

    def _inputs(self, cls: str, feats: np.ndarray) -> np.ndarray:
        """Standardised MLP inputs (float64), clipped to the training range.

        Clipping makes a kernel larger than any trained on (more waves, a bigger footprint)
        saturate at the edge of what was learned instead of extrapolating the MLP freely;
        the wave count still enters through ``u`` and the roofline through the bound.
        """
        mean, std, lo, hi = self.norm[cls]
        return np.clip((feats - mean) / std, lo, hi)

    def _scale(self, frame: pd.DataFrame) -> np.ndarray:
        """What the MLP's time is multiplied by: the waves (bounded) or 1 (plain latency)."""
        return frame["waves"].to_numpy(float) if self.bounded else np.ones(len(frame))

    def _latency(self, cls: str, raw: np.ndarray, frame: pd.DataFrame) -> np.ndarray:
        """Latency in ms (float64) of each kernel from the MLP's raw outputs."""
        wave_ms = self._wave_ms(raw, wave_context(frame), self.configs[cls]["form"])
        return wave_ms * self._scale(frame)

    def utilisation(self, frame: pd.DataFrame) -> np.ndarray:
        """The predicted utilisation u in (0, 1] of each kernel (bounded model only): of one
        wave's roofline under the wave laws, of the kernel's roofline under the kernel laws."""
        frame = self._pack(self._nominal(self.tiles.fill(frame)))
        out = np.empty(len(frame))
        for cls, idx, sub in by_class(frame):
            raw, ctx = self._outputs(cls, sub), wave_context(sub)
            form = self.configs[cls]["form"]
            # wave laws: of one wave's roofline; kernel laws: of the kernel's roofline
            ref = ctx[:, 5] / ctx[:, 1] if form in KERNEL_LAWS else ctx[:, 0]
            out[idx] = ref / wave_ms(raw, ctx, form)
        return out

    # ----- training (torch)
    def fit(self, frame: pd.DataFrame, progress: bool = True) -> "NeuSight":
        self.tiles.fit(frame)
        self.nominal.fit(frame)
        self.packing.fit(frame)
        frame = self._pack(self._nominal(frame))
        for i, (cls, _, sub) in enumerate(by_class(frame)):
            self._fit_class(cls, sub.reset_index(drop=True), self.seed + i, progress)
        return self

    def _fit_class(self, cls: str, df: pd.DataFrame, seed: int, progress: bool) -> None:
        import torch
        cfg = TrainConfig(**self.configs[cls])
        feats = tile_features(df, cfg.features)
        mean, std = feats.mean(axis=0), feats.std(axis=0)
        std = np.where(std > 0, std, 1.0)
        z = (feats - mean) / std
        lo, hi = (z.min(axis=0), z.max(axis=0)) if cfg.clip else \
            (np.full(len(mean), -np.inf), np.full(len(mean), np.inf))
        self.norm[cls] = (mean, std, lo, hi)
        x = torch.from_numpy(self._inputs(cls, feats).astype(np.float32))
        target = torch.from_numpy(df["latency_ms"].to_numpy(float) / self._scale(df))
        ctx = torch.from_numpy(wave_context(df))
        members, hists = [], []
        for k in range(cfg.ensemble):
            s = seed + 1000 * k
            model, hist = self._fit_member(cls, cfg, df, x, target, ctx, s, progress)
            members.append(mlp_weights(model))
            hists.append(hist)
        self.models[cls] = members
        # per-epoch validation SMAPE (the members' mean for an ensemble)
        self.history[cls] = hists[0] if cfg.ensemble == 1 else [float(v) for v in np.mean(hists, axis=0)]

    def _split(self, cfg: "TrainConfig", df: pd.DataFrame, rng) -> tuple[np.ndarray, np.ndarray]:
        """(validation, training) row indices: random, or the highest-peak GPU held out."""
        perm = rng.permutation(len(df))
        if cfg.val == "gpu" and df["gpu"].nunique() > 1:
            top = df.groupby("gpu")["peak_gflops"].first().idxmax()
            held = (df["gpu"] == top).to_numpy()[perm]
            return perm[held], perm[~held]
        if cfg.val not in ("random", "gpu"):
            raise ValueError(f"unknown NeuSight validation {cfg.val!r}; known: random, gpu")
        n_val = int(round(cfg.val_frac * len(df)))
        return perm[:n_val], perm[n_val:]

    def _fit_member(self, cls, cfg, df, x, target, ctx, seed, progress):
        """One MLP trained from ``seed``: the epoch with the best validation SMAPE is kept."""
        import torch
        from tqdm.auto import tqdm
        rng = np.random.default_rng(seed)
        torch.manual_seed(seed)
        model = make_mlp(len(cfg.features), cfg.layers, cfg.hidden, OUTPUTS.get(cfg.form, 2))
        val, tr = self._split(cfg, df, rng)
        n_val = len(val)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs)
        best, best_state, hist = np.inf, None, []
        bar = tqdm(range(cfg.epochs), desc=f"{self.name} {cls}", disable=not progress, leave=False)
        for _ in bar:
            model.train()
            order = tr[rng.permutation(len(tr))]
            for s in range(0, len(order), cfg.batch):
                b = torch.from_numpy(order[s:s + cfg.batch])
                pred = self._wave_ms(model(x[b]), ctx[b], cfg.form)
                loss = smape(pred, target[b])
                opt.zero_grad()
                loss.backward()
                opt.step()
            sched.step()
            model.eval()
            with torch.no_grad():
                vb = torch.from_numpy(val if n_val else tr)
                err = float(smape(self._wave_ms(model(x[vb]), ctx[vb], cfg.form), target[vb]))
            hist.append(err)
            if err < best:
                best, best_state = err, {k: v.clone() for k, v in model.state_dict().items()}
            bar.set_postfix(val_smape=f"{err:.4f}")
        model.load_state_dict(best_state)
        model.eval()
        return model, hist

    def _wave_ms(self, raw, ctx, form="paper"):
        """Per-wave ms (bounded) or whole-kernel ms (unbounded) from raw MLP outputs (numpy
        arrays, or torch tensors in training)."""
        raw = raw.double() if hasattr(raw, "double") else raw
        if not self.bounded:
            return _ops(raw).exp(raw[:, 0::2]).mean(1)
        return wave_ms(raw, ctx, form)

    # ----- prediction
    def _nominal(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Nominal tiles for the classes configured so (``tiles="nominal"``)."""
        classes = [c for c, cfg in self.configs.items() if cfg.get("tiles") == "nominal"]
        return self.nominal.nominal(frame, classes) if classes else frame

    def _pack(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Pack softmax rows into blocks (:class:`RowPacking`) for classes configured so."""
        classes = [c for c in RowPacking.CLASSES if self.configs[c].get("pack_rows", False)]
        if not classes or not frame["cls"].isin(classes).any():
            return frame
        return self.packing.apply(frame)

    def predict(self, frame: pd.DataFrame, lookup: bool = False) -> np.ndarray:
        """Latency in ms per row; ``lookup=True`` ignores parsed tiles and looks all up."""
        frame = self._pack(self._nominal(self.tiles.fill(frame, lookup_all=lookup)))
        out = np.empty(len(frame))
        for cls, idx, sub in by_class(frame):
            if cls not in self.models:
                raise ValueError(f"{self.name} has no trained {cls} model; train it first")
            out[idx] = self._latency(cls, self._outputs(cls, sub), sub)
        return out

    # ----- persistence
    def get_state(self) -> dict:
        return {"seed": self.seed, "configs": self.configs, "bounded": self.bounded,
                "models": self.models, "norm": self.norm,
                "tiles": self.tiles.get_state(), "nominal": self.nominal.get_state(),
                "packing": self.packing.get_state(), "history": self.history}

    def set_state(self, state: dict) -> None:
        if bool(state["bounded"]) != self.bounded:
            raise ValueError("bounded/unbounded mismatch")
        self.seed, self.configs, self.history = state["seed"], state["configs"], state["history"]
        self.models = {}
        for c, members in state["models"].items():
            cfg = TrainConfig(**self.configs[c])
            self.configs[c] = {**asdict(cfg), "features": tuple(cfg.features)}
            self.models[c] = [[np.asarray(a, np.float32) for a in w] for w in members]
            _check_weights(c, cfg, self.models[c])
        self.norm = {c: tuple(np.asarray(a, float) for a in arrs)
                     for c, arrs in state["norm"].items()}
        self.tiles = TileLookup.from_state(state["tiles"])
        self.nominal = TileLookup.from_state(state.get("nominal", {"_gpu_free": True}))
        self.packing = RowPacking.from_state(state.get("packing"))


def _check_weights(cls: str, cfg: TrainConfig, members: list) -> None:
    """ValueError unless ``members`` are the weights :func:`make_mlp` has for ``cfg``."""
    n_out = OUTPUTS.get(cfg.form, 2)
    dims = [len(cfg.features)] + [cfg.hidden] * cfg.layers + [n_out]
    want = [s for a, b in zip(dims, dims[1:]) for s in ((b, a), (b,))]
    if len(members) != cfg.ensemble:
        raise ValueError(f"{cls}: {len(members)} ensemble members, the config has "
                         f"{cfg.ensemble}")
    for w in members:
        got = [a.shape for a in w]
        if got != want:
            raise ValueError(f"{cls}: weight shapes {got} are not the config's {want}")
