"""FlashAttention latency, NeuSight style: a learned utilisation of the kernel's own roofline.

The kind (FLOPs, bytes, roofline, launch geometry) is :mod:`.attention_kind`; this module is
the predictor :class:`TensorAttention` (``neusight``). Per row

    t = c + compute / gamma + memory / delta                                       (ms)

``compute``: the FLOP FlashAttention's CTAs compute (blocks padded, masked blocks whole) at the
tensor-core peak, divided by the wave fill (a partial last wave leaves SMs idle);
``memory``: the minimum DRAM bytes at the datasheet bandwidth; ``c``: a launch overhead of at
most ``C_MAX_CYCLES`` SM clock cycles (``clock_mhz``). gamma, delta in (0, 1) and c's fraction
come from one small MLP (prefill and decode together, the phase as an input) over log2 shape
inputs, the CTAs per SM and key splits of FlashAttention's launch, the working set over the L2
size and the SM cycles per DRAM byte (standardised, clipped to the training range). Peak and
bandwidth enter only through the physical terms, so the prediction is never below the roofline
and a faster datasheet moves it the way the hardware would. Choices and evidence:
DECISIONS.md, "FlashAttention". Loss: mean absolute log error (the metric is MAPE).
"""
from __future__ import annotations

import sys
import time

import numpy as np
import pandas as pd

from .attention_kind import ATTENTION, attention_roofline_ms, check_frame, launch_geometry
from .base import Predictor

__all__ = ["ATTENTION", "attention_roofline_ms", "TensorAttention", "PREDICTORS"]

C_MAX_MS = 0.05      # the launch overhead is at most 50 us (measured floors: 7-11 us)
GPU_INPUTS = ("l2_mb", "clock_mhz")  # datasheet columns the predictor needs beyond the roofline
C_MAX_CYCLES = 1e5   # or at most 1e5 SM clock cycles (50 us at 2 GHz)
PHASES = ("prefill", "decode")
FEATURES = ("batch", "q_len", "kv_len", "heads", "group", "head_dim", "ctas_per_sm", "splits",
            "l2_fit", "sm_cycles_per_byte")


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
    l2 = frame["l2_mb"].to_numpy(float) * 2**20
    cols.update(group=cols["heads"] / cols["kv_heads"], ctas_per_sm=geo["ctas"] / sm,
                splits=geo["splits"], waves=geo["waves"], num_sm=sm,
                l2_fit=ATTENTION.bytes(frame) / l2,
                sm_cycles_per_byte=sm * frame["clock_mhz"].to_numpy(float) * 1e-3
                / frame["mem_bw"].to_numpy(float))
    unknown = [f for f in features if f not in cols]
    if unknown:
        raise ValueError(f"unknown attention feature(s) {unknown}; known: {sorted(cols)}")
    return np.log2(np.column_stack([cols[f] for f in features]))


def physical_terms(frame: pd.DataFrame, overhead: str = "fixed") -> np.ndarray:
    """(n, 3) ms: compute (padded FLOP at the peak over the wave fill), memory (bytes at the
    bandwidth) and the roofline (exact FLOP and bytes)."""
    geo = launch_geometry(frame)
    peak = frame["bf16_gflops"].to_numpy(float) * 1e9
    compute = 1e3 * geo["tile_flops"] / (peak * geo["fill"])
    memory = 1e3 * ATTENTION.bytes(frame) / (frame["mem_bw"].to_numpy(float) * 1e9)
    if overhead == "cycles":  # a fixed number of cycles at the SM clock
        scale = 1e3 * C_MAX_CYCLES / (frame["clock_mhz"].to_numpy(float) * 1e6)
    else:
        scale = np.full(len(frame), C_MAX_MS)
    return np.column_stack([compute, memory, attention_roofline_ms(frame), scale])


def _law(raw, terms, lib, law="max"):
    """Latency (ms) from raw MLP outputs (gamma, delta, c before their squashing); ``terms``
    column 3 is the overhead's scale (ms)."""
    sig = lib.sigmoid if hasattr(lib, "sigmoid") else \
        (lambda v: 1 / (1 + np.exp(-np.clip(v, -60, 60))))
    gamma, delta, c = sig(raw[:, 0]), sig(raw[:, 1]), terms[:, 3] * sig(raw[:, 2])
    if law == "sum":
        return c + terms[:, 0] / gamma + terms[:, 1] / delta
    return c + lib.maximum(terms[:, 0] / gamma, terms[:, 1] / delta)


def _forward(weights: list, x: np.ndarray) -> np.ndarray:
    """The MLP (ReLU hidden layers) in numpy, for prediction without torch."""
    h = x
    for i in range(0, len(weights) - 2, 2):
        h = np.maximum(h @ weights[i].T + weights[i + 1], 0.0)
    return h @ weights[-2].T + weights[-1]


class TensorAttention(Predictor):
    """NeuSight-style FlashAttention predictor (module docstring). ``quick``: a small
    subsample and few epochs, for tests; ``max_rows``: training rows per phase (a random
    subsample, seeded); ``shared``: one MLP for both phases (phase as an extra input)."""

    name = "neusight"
    description = "FlashAttention: learned utilisation of the tensor-core/bandwidth roofline"

    def __init__(self, seed: int = 0, quick: bool = False, max_rows: int = 6000,
                 epochs: int = 20, hidden: int = 64, layers: int = 3, lr: float = 3e-3,
                 features=FEATURES, shared: bool = True, overhead: str = "cycles",
                 law: str = "sum"):
        if law not in ("sum", "max") or overhead not in ("cycles", "fixed"):
            raise ValueError(f"law must be 'sum' or 'max' (got {law!r}), overhead 'cycles' or "
                             f"'fixed' (got {overhead!r})")
        self.seed, self.hidden, self.layers, self.lr = seed, hidden, layers, lr
        self.max_rows = 2000 if quick else max_rows
        self.epochs = 10 if quick else epochs
        self.features, self.shared = tuple(features), bool(shared)
        self.overhead, self.law = overhead, law
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
            idx = np.flatnonzero(groups == grp)
            if len(idx) > self.max_rows:
                idx = np.sort(rng.choice(idx, self.max_rows, replace=False))
            self._fit_group(grp, frame.iloc[idx].reset_index(drop=True), self.seed + i)
            if progress:
                print(f"nslib: attention {grp}: {len(idx)} rows, "  # stderr: stdout may be JSON
                      f"{time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        self.train_seconds = time.perf_counter() - start
        return self

    def _fit_group(self, grp: str, df: pd.DataFrame, seed: int) -> None:
        import torch
        torch.manual_seed(seed)
        feats = self._x(df)
        mean, std = feats.mean(axis=0), feats.std(axis=0)
        std = np.where(std > 0, std, 1.0)
        z = (feats - mean) / std
        self.norm[grp] = (mean, std, z.min(axis=0), z.max(axis=0))
        x = torch.from_numpy(z.astype(np.float32))
        terms = torch.from_numpy(physical_terms(df, self.overhead))
        log_y = torch.from_numpy(np.log(df["latency_ms"].to_numpy(float)))
        dims = [x.shape[1]] + [self.hidden] * self.layers
        mods = [m for a, b in zip(dims, dims[1:]) for m in (torch.nn.Linear(a, b),
                                                              torch.nn.ReLU())]
        model = torch.nn.Sequential(*mods, torch.nn.Linear(dims[-1], 3))
        opt = torch.optim.AdamW(model.parameters(), lr=self.lr, weight_decay=1e-4)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=self.epochs)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(self.epochs):
            for b in torch.randperm(len(x), generator=gen).split(256):
                pred = _law(model(x[b]).double(), terms[b], torch, self.law)
                loss = (pred.log() - log_y[b]).abs().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            sched.step()
        self.models[grp] = [p.detach().numpy().astype(np.float64) for p in model.parameters()]

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        """Latency (ms) per row, never below the row's roofline."""
        check_frame(frame, gpu=True, extra=GPU_INPUTS)
        out = np.empty(len(frame))
        groups = self._groups(frame)
        for grp in pd.unique(groups):
            if grp not in self.models:
                raise ValueError(f"{self.name} attention has no trained {grp} model; fit it "
                                 f"on rows of that phase first")
            idx = np.flatnonzero(groups == grp)
            sub = frame.iloc[idx]
            mean, std, lo, hi = self.norm[grp]
            z = np.clip((self._x(sub) - mean) / std, lo, hi)
            terms = physical_terms(sub, self.overhead)
            ms = _law(_forward(self.models[grp], z), terms, np, self.law)
            out[idx] = np.maximum(ms, terms[:, 2])  # the roofline bounds it
        return out

    def get_state(self) -> dict:
        return {"seed": self.seed, "hidden": self.hidden, "layers": self.layers,
                "lr": self.lr, "max_rows": self.max_rows, "epochs": self.epochs,
                "features": list(self.features), "shared": self.shared, "overhead": self.overhead,
                "law": self.law,
                "models": self.models, "norm": self.norm, "train_seconds": self.train_seconds}

    def set_state(self, state: dict) -> None:
        for k in ("seed", "hidden", "layers", "lr", "max_rows", "epochs", "shared", "overhead",
                  "law",
                  "train_seconds"):
            setattr(self, k, state[k])
        self.features = tuple(state["features"])
        self.models = {g: [np.asarray(a, np.float64) for a in w]
                       for g, w in state["models"].items()}
        self.norm = {g: tuple(np.asarray(a, float) for a in v) for g, v in state["norm"].items()}
        n_in = len(self.features) + self.shared
        for g, w in self.models.items():
            if w[0].shape[1] != n_in or w[-1].shape[0] != 3:
                raise ValueError(f"{g}: weights take {w[0].shape[1]} inputs and give "
                                 f"{w[-1].shape[0]} outputs, not {n_in} and 3")


PREDICTORS = {"neusight": TensorAttention}
