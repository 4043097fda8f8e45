"""FlashAttention latency, nslib's bounded design after NeuSight: a learned utilisation of the kernel's own roofline.

The kind (FLOPs, bytes, roofline, launch geometry) is :mod:`.attention_kind`; this module is
the predictor :class:`TensorAttention` (``nslib``). Per row

    t = c + compute / gamma + dram / delta + l2 / lam                              (ms)

``compute``: the FLOP FlashAttention's CTAs compute (blocks padded, masked blocks whole) at the
tensor-core peak, divided by the wave fill (a partial last wave leaves SMs idle); ``dram``: the
minimum bytes beyond the L2 size at the datasheet bandwidth; ``l2``: the bytes the L2 holds
(the benchmark repeats each call, so a working set under the L2 size stays there) at the
bandwidth, ``lam`` in (0.5, 4) their rate's multiple of it; ``c``: a launch overhead of at
most ``C_MAX_MS`` plus at most ``C_MAX_CYCLES`` SM clock cycles (``clock_mhz``): a host/launch
part and an on-chip part. gamma, delta in (0, 1), lam and c's fractions come from a small MLP
per phase (prefill, decode; every training GPU weighing the same) over log2 shape inputs, the
CTAs per SM and key splits of FlashAttention's launch and the working set over the L2 size
(standardised, clipped to the training range). Peak, bandwidth and clock enter only through the physical
terms, so the prediction is never below the floor ``max(FLOP / peak, bytes beyond L2 /
bandwidth)`` and a faster datasheet moves it the way the hardware would. Choices and evidence:
docs/decisions.md, "FlashAttention". Loss: mean absolute log error (the metric is MAPE).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from nslib.data.units import GHZ_PER_MHZ, GIGA, MEGA, MIB, MS_PER_S
from nslib.predictors.attention_kind import (ATTENTION, attention_roofline_ms, check_frame,
                                             launch_geometry)
from nslib.predictors.base import Predictor
from nslib.predictors.fitting import Fit, fit_mlp, log_error
from nslib.predictors.network import mlp_forward
from nslib.predictors.scaling import fit_scaling, standardise

__all__ = ["ATTENTION", "attention_roofline_ms", "floor_ms", "TensorAttention",
           "AttentionConfig"]

C_MAX_MS = 0.05      # the launch overhead is at most 50 us (measured floors: 7-11 us)
GPU_INPUTS = ("l2_mb", "clock_mhz")  # datasheet columns the predictor needs beyond the roofline
C_MAX_CYCLES = 1e5   # or at most 1e5 SM clock cycles (50 us at 2 GHz)
LAM_LO, LAM_HI = 0.5, 4.0  # L2-resident bytes stream at this multiple of the DRAM bandwidth
PHASES = ("prefill", "decode")
BATCH = 256          # training rows per step
SIGMOID_CLIP = 60    # numpy's sigmoid: exp(-x) overflows float64 past ~709, so clip far inside
FEATURES = ("batch", "q_len", "kv_len", "heads", "group", "head_dim", "ctas_per_sm", "splits",
            "l2_fit")


def phase_of(frame: pd.DataFrame) -> np.ndarray:
    """``decode`` for one-query rows (``q_len == 1``), else ``prefill``."""
    return np.where(frame["q_len"].to_numpy(float) == 1, "decode", "prefill")


def attention_inputs(frame: pd.DataFrame, features=FEATURES) -> np.ndarray:
    """(n, len(features)) log2 MLP inputs: the shape columns, ``group`` (query heads per KV
    head), ``ctas_per_sm`` (CTAs FlashAttention launches per SM), ``splits`` (key splits),
    ``waves``, ``num_sm``, ``sm_cycles_per_byte`` (SMs x clock over DRAM bandwidth: how fast
    on-chip traffic is next to DRAM's), ``l2_fit`` (DRAM bytes over the L2 size: a working
    set the L2 holds stays there between the benchmark's repetitions)."""
    geo = launch_geometry(frame)
    sm = frame["num_sm"].to_numpy(float)
    cols = {c: frame[c].to_numpy(float) for c in ("batch", "q_len", "kv_len", "heads",
                                                  "kv_heads", "head_dim")}
    l2 = frame["l2_mb"].to_numpy(float) * MIB
    cols.update(group=cols["heads"] / cols["kv_heads"], ctas_per_sm=geo["ctas"] / sm,
                splits=geo["splits"], waves=geo["waves"], num_sm=sm,
                l2_fit=ATTENTION.bytes(frame) / l2,
                sm_cycles_per_byte=sm * frame["clock_mhz"].to_numpy(float) * GHZ_PER_MHZ
                / frame["mem_bw"].to_numpy(float))
    unknown = [f for f in features if f not in cols]
    if unknown:
        raise ValueError(f"unknown attention feature(s) {unknown}; known: {sorted(cols)}")
    return np.log2(np.column_stack([cols[f] for f in features]))


def physical_terms(frame: pd.DataFrame, overhead: str = "both", l2: bool = True) -> np.ndarray:
    """(n, 6) ms: compute (padded FLOP at the peak over the wave fill), DRAM (bytes beyond the
    L2 at the bandwidth; all bytes without ``l2``), the floor (the roofline, or with ``l2``
    ``max(FLOP / peak, bytes beyond L2 / bandwidth)``), the overhead's scale (``C_MAX_MS``, or
    ``C_MAX_CYCLES`` at the clock with ``overhead="cycles"``), the L2-resident bytes at the DRAM
    bandwidth (0 without ``l2``) and, with ``overhead="both"``, ``C_MAX_CYCLES`` at the clock."""
    geo = launch_geometry(frame)
    peak = frame["bf16_gflops"].to_numpy(float) * GIGA
    bw = frame["mem_bw"].to_numpy(float) * GIGA
    compute = MS_PER_S * geo["tile_flops"] / (peak * geo["fill"])
    nbytes = ATTENTION.bytes(frame)
    beyond = np.maximum(nbytes - frame["l2_mb"].to_numpy(float) * MIB, 0.0) if l2 else nbytes
    floor = MS_PER_S * np.maximum(ATTENTION.flops(frame) / peak, beyond / bw)
    cycles = MS_PER_S * C_MAX_CYCLES / (frame["clock_mhz"].to_numpy(float) * MEGA)
    fixed = np.full(len(frame), C_MAX_MS)
    scale = cycles if overhead == "cycles" else fixed
    second = cycles if overhead == "both" else np.zeros(len(frame))
    return np.column_stack([compute, MS_PER_S * beyond / bw, floor, scale,
                            MS_PER_S * (nbytes - beyond) / bw, second])


def floor_ms(frame: pd.DataFrame, l2: bool = True) -> np.ndarray:
    """The physical floor (ms) of each row: ``max(FLOP / peak, bytes beyond L2 / bandwidth)``
    (the plain roofline without ``l2``)."""
    return physical_terms(frame, l2=l2)[:, 2]


def _law(raw, terms, lib, law="max"):
    """Latency (ms) from raw MLP outputs (gamma, delta, c, lam, c2 before their squashing) and
    :func:`physical_terms` (ms)."""
    sig = lib.sigmoid if hasattr(lib, "sigmoid") else \
        (lambda v: 1 / (1 + np.exp(-np.clip(v, -SIGMOID_CLIP, SIGMOID_CLIP))))
    gamma, delta, c = sig(raw[:, 0]), sig(raw[:, 1]), terms[:, 3] * sig(raw[:, 2])
    # L2-resident bytes at LAM_LO..LAM_HI times the DRAM bandwidth
    lam = LAM_LO + (LAM_HI - LAM_LO) * sig(raw[:, 3])
    c = c + terms[:, 5] * sig(raw[:, 4])  # overhead "both": SM cycles beside a fixed time
    if law == "sum":
        return c + terms[:, 0] / gamma + terms[:, 1] / delta + terms[:, 4] / lam
    return c + lib.maximum(lib.maximum(terms[:, 0] / gamma, terms[:, 1] / delta),
                           terms[:, 4] / lam)


@dataclass(frozen=True)
class AttentionConfig:
    """Settings of :class:`TensorAttention`: ``max_rows`` training rows per phase (a random
    subsample, seeded; ``balance``: an equal share per GPU), ``epochs``, the network (``layers``
    of ``hidden`` units, learning rate ``lr``) and its inputs (``features``); ``shared``: one MLP
    for both phases (phase as an extra input; default one per phase); ``overhead``: "both"
    (fixed time plus SM cycles), "cycles" or "fixed"; ``law``: the terms' "sum" or "max";
    ``l2``: the L2-aware memory terms and floor; ``gpu_weights``: every training GPU weighs the
    same in the loss."""

    max_rows: int = 4000
    epochs: int = 20
    hidden: int = 64
    layers: int = 3
    lr: float = 3e-3
    features: tuple = FEATURES
    shared: bool = False
    overhead: str = "both"
    law: str = "sum"
    l2: bool = True
    balance: bool = False
    gpu_weights: bool = True


class TensorAttention(Predictor):
    """nslib's bounded FlashAttention predictor (module docstring), set by an
    :class:`AttentionConfig` (``config``, with ``changes`` to its fields). ``quick``: a small
    subsample and few epochs, for tests."""

    name = "nslib"
    description = "FlashAttention: learned utilisation of the tensor-core/bandwidth roofline"

    def __init__(self, seed: int = 0, quick: bool = False,
                 config: AttentionConfig | None = None, **changes):
        cfg = replace(config or AttentionConfig(), **changes)
        if cfg.law not in ("sum", "max") or cfg.overhead not in ("cycles", "fixed", "both"):
            raise ValueError(f"law must be 'sum' or 'max' (got {cfg.law!r}), overhead 'cycles' "
                             f"or 'fixed' (got {cfg.overhead!r})")
        self.seed, self.hidden, self.layers, self.lr = seed, cfg.hidden, cfg.layers, cfg.lr
        self.max_rows = 2000 if quick else cfg.max_rows
        self.epochs = 10 if quick else cfg.epochs
        self.features, self.shared = tuple(cfg.features), bool(cfg.shared)
        self.overhead, self.law = cfg.overhead, cfg.law
        self.l2, self.balance = bool(cfg.l2), bool(cfg.balance)
        self.gpu_weights = bool(cfg.gpu_weights)
        self.models: dict[str, list] = {}
        self.norm: dict[str, tuple] = {}
        self.train_seconds = 0.0

    def _groups(self, frame: pd.DataFrame) -> np.ndarray:
        return np.full(len(frame), "all") if self.shared else phase_of(frame)

    def _x(self, frame: pd.DataFrame) -> np.ndarray:
        x = attention_inputs(frame, self.features)
        if self.shared:
            x = np.column_stack([x, (phase_of(frame) == "decode").astype(float)])
        return x

    def fit(self, frame: pd.DataFrame, progress: bool = True) -> "TensorAttention":
        """Train on measured attention rows (``latency_ms``); returns self."""
        check_frame(frame, gpu=True, extra=GPU_INPUTS)
        if "latency_ms" not in frame or not (frame["latency_ms"].to_numpy(float) > 0).all():
            raise ValueError("training needs a positive latency_ms column (ms) on every row")
        start = time.perf_counter()
        rng = np.random.default_rng(self.seed)
        groups = self._groups(frame)
        for i, grp in enumerate(pd.unique(groups)):
            idx = self._sample(frame, np.flatnonzero(groups == grp), rng)
            self._fit_group(grp, frame.iloc[idx].reset_index(drop=True), self.seed + i)
            if progress:
                print(f"nslib: attention {grp}: {len(idx)} rows, "  # stderr: stdout may be JSON
                      f"{time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        self.train_seconds = time.perf_counter() - start
        return self

    def _n_out(self) -> int:
        """MLP outputs: gamma, delta, c, lambda and the cycles overhead (used with ``both``)."""
        return 5

    def _sample(self, frame: pd.DataFrame, idx: np.ndarray, rng) -> np.ndarray:
        """At most ``max_rows`` of the rows ``idx`` (``balance``: an equal share per GPU)."""
        if not self.balance:
            return idx if len(idx) <= self.max_rows else \
                np.sort(rng.choice(idx, self.max_rows, replace=False))
        gpus = frame["gpu"].to_numpy()[idx]
        share = self.max_rows // len(pd.unique(gpus))
        parts = [idx[gpus == g] for g in pd.unique(gpus)]
        return np.sort(np.concatenate([p if len(p) <= share else
                                       rng.choice(p, share, replace=False) for p in parts]))

    def _row_weights(self, df: pd.DataFrame):
        """Per-row loss weights: with ``gpu_weights`` every training GPU weighs the same in
        total (mean 1), else None (every row alike)."""
        if not self.gpu_weights:
            return None
        _, inv, counts = np.unique(df["gpu"].to_numpy(), return_inverse=True,
                                   return_counts=True)
        return len(df) / (len(counts) * counts[inv])

    def _fit_group(self, grp: str, df: pd.DataFrame, seed: int) -> None:
        """Train the MLP of phase group ``grp`` on its rows ``df`` (|log error|, every
        epoch, the last kept)."""
        import torch
        feats = self._x(df)
        self.norm[grp] = fit_scaling(feats)
        law = self.law
        fit = Fit(hidden=self.hidden, layers=self.layers, epochs=self.epochs, batch=BATCH,
                  lr=self.lr, n_out=self._n_out(),
                  head=lambda raw, terms: _law(raw, terms, torch, law), loss=log_error,
                  val_frac=0.0, seed=seed)
        weights = fit_mlp(standardise(feats, self.norm[grp]), df["latency_ms"].to_numpy(float),
                          fit, ctx=physical_terms(df, self.overhead, self.l2),
                          weights=self._row_weights(df), progress=False)
        self.models[grp] = [w.astype(np.float64) for w in weights]

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        """Latency (ms) per row, never below the row's floor (:func:`floor_ms`), nor below
        the kernels it contains: one query over the same keys (a prefill row) and one query
        over one key (every row), same batch, heads and GPU. Each phase has its own MLP, and
        neither is monotone in the shape by construction; a kernel with more queries or keys
        reads and computes all that the smaller one does, so it never costs less."""
        check_frame(frame, gpu=True, extra=GPU_INPUTS)
        out = self._predict_mlp(frame)
        if not (self.shared or "decode" in self.models):
            return out   # a prefill-only fit has no one-query kernel to compare with
        pre = np.flatnonzero(phase_of(frame) == "prefill")
        if len(pre):
            out[pre] = np.maximum(out[pre], self._predict_mlp(frame.iloc[pre].assign(q_len=1)))
        return np.maximum(out, self._predict_mlp(frame.assign(q_len=1, kv_len=1)))

    def _predict_mlp(self, frame: pd.DataFrame) -> np.ndarray:
        """Each row's own phase MLP under the law, at least the physical floor (ms)."""
        out = np.empty(len(frame))
        groups = self._groups(frame)
        for grp in pd.unique(groups):
            if grp not in self.models:
                raise ValueError(f"{self.name} attention has no trained {grp} model; fit it "
                                 f"on rows of that phase first")
            idx = np.flatnonzero(groups == grp)
            sub = frame.iloc[idx]
            z = standardise(self._x(sub), self.norm[grp])
            terms = physical_terms(sub, self.overhead, self.l2)
            ms = _law(mlp_forward(self.models[grp], z), terms, np, self.law)
            out[idx] = np.maximum(ms, terms[:, 2])  # the physical floor bounds it
        return out

    def get_state(self) -> dict:
        return {"seed": self.seed, "hidden": self.hidden, "layers": self.layers,
                "lr": self.lr, "max_rows": self.max_rows, "epochs": self.epochs,
                "features": list(self.features), "shared": self.shared, "overhead": self.overhead,
                "law": self.law, "l2": self.l2, "balance": self.balance,
                "gpu_weights": self.gpu_weights,
                "models": self.models, "norm": self.norm, "train_seconds": self.train_seconds}

    def set_state(self, state: dict) -> None:
        for k in ("seed", "hidden", "layers", "lr", "max_rows", "epochs", "shared", "overhead",
                  "law", "l2", "balance", "train_seconds"):
            setattr(self, k, state[k])
        self.gpu_weights = bool(state.get("gpu_weights", False))  # absent: saved before it
        self.features = tuple(state["features"])
        self.models = {g: [np.asarray(a, np.float64) for a in w]
                       for g, w in state["models"].items()}
        self.norm = {g: tuple(np.asarray(a, float) for a in v) for g, v in state["norm"].items()}
        n_in = len(self.features) + self.shared
        for g, w in self.models.items():
            if w[0].shape[1] != n_in or w[-1].shape[0] != self._n_out():
                raise ValueError(f"{g}: weights take {w[0].shape[1]} inputs and give "
                                 f"{w[-1].shape[0]} outputs, not {n_in} and {self._n_out()}")
