"""BF16 tensor-core GEMMs: the ``GEMM`` kind and nslib's bounded predictor, :class:`TensorGemm`.

A GEMM ``[m x k] @ [k x n]`` (frame columns ``m, n, k``; datasheet columns ``bf16_gflops``,
``mem_bw``, ``l2_mb``, ``num_sm``, ``peak_gflops``) takes, in ms,

    t = c + pmax(comp / gamma, dram / delta, tile / eta, l2 / lam)

never below its roofline ``max(F / peak, max(B - L2, 0) / bw)``; ``pmax`` is a smooth
maximum (p-norm, p = 4, >= the max) of the terms (ms):

- ``comp``: the FLOPs of the waves of tiles the library's heuristic would launch
  (:mod:`nslib.kernels.tc_tiles`), every wave full, at the BF16 peak;
- ``dram``: the bytes beyond L2, ``max(B - L2, 0)``, at the DRAM bandwidth (``B``: 2 bytes per
  element of A, B and C once): a benchmark repeating one GEMM keeps a working set that fits in
  L2 resident (L40S and RTX PRO 6000 GEMMs under their L2 size run up to 3x faster than their
  DRAM roofline);
- ``l2``: the L2-resident bytes at the DRAM bandwidth, ``lam`` in (0.5, 4) its multiple;
- ``tile``: the bytes the launched CTAs load (``k * (tile_m + tile_n)`` elements each) at the
  DRAM bandwidth, ``eta`` in (1, 16) the L2 reuse: a GPU with little bandwidth per FLOP (L40S)
  cannot feed its tensor cores even for big GEMMs.

A small MLP maps inputs that do not depend on the SM count (tile, split-K, working set over
L2, m, n, k; log2, clipped to the training range) to c (``exp(raw_a) * 2 us + exp(raw_b) *
4000`` SM clocks at the datasheet clock: a launch part and a prologue/k-loop latency part),
gamma in (0, 1) and the other efficiencies: peak and bandwidth act only through the physical
terms, so the law extrapolates to datasheets outside the training range (B200/GB200). A
prediction is the fastest of a few launches the GPU could run (two tiles; the GPU and it
restricted to fewer SMs), so more SMs seldom make a GEMM slower (the restrictions are a grid;
`nslib.evaluation.tensor_properties` counts the rows). Design choices and leave-one-GPU-out
evidence: docs/decisions.md, "BF16 GEMMs".
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from nslib.data.units import GIGA, KILO, MIB, MS_PER_S
from nslib.kernels.tc_tiles import MACS, choose_tiles
from nslib.predictors.base import Predictor
from nslib.predictors.fitting import MEMBER_SEED_STRIDE, Fit, fit_mlp, log_error
from nslib.predictors.network import EXP_CLIP, SIGMOID_CLIP, mlp_forward
from nslib.predictors.scaling import fit_scaling, standardise

FIXED_MS = 0.002      # scale of the fixed cost c: exp(raw) * 2 us (the smallest GEMMs' time)
FIXED_CYCLES = 4000.0  # or in SM clocks: exp(raw) * 4000 cycles at the datasheet clock
FEATURES = ("tile_m", "tile_n", "split", "k_split", "waves", "fill", "num_sm", "l2_ratio",
            "m", "n", "k")
FLOP_PER_MAC = 2.0    # a multiply-add is two FLOPs
BYTES = 2.0           # bytes per BF16 element
NEEDED = ("m", "n", "k", "num_sm", "bf16_gflops", "peak_gflops", "mem_bw", "l2_mb", "clock_mhz")


class GemmKind:
    """The BF16 GEMM kind: ``[m x k] @ [k x n]`` from columns ``m, n, k``."""

    name = "gemm"

    def flops(self, frame: pd.DataFrame) -> np.ndarray:
        """FLOP of each GEMM: ``2 m n k``."""
        m, n, k = _dims(frame)
        return FLOP_PER_MAC * m * n * k

    def bytes(self, frame: pd.DataFrame) -> np.ndarray:
        """Minimum DRAM bytes of each GEMM: read A and B, write C once, 2 bytes per element."""
        m, n, k = _dims(frame)
        return BYTES * (m * k + k * n + m * n)

    def shape_features(self, frame: pd.DataFrame) -> np.ndarray:
        """(rows, 3) raw shape inputs ``m, n, k``."""
        return np.column_stack(_dims(frame))


GEMM = GemmKind()


def _dims(frame: pd.DataFrame) -> tuple[np.ndarray, ...]:
    lacking = [c for c in "mnk" if c not in frame.columns]
    if lacking:
        raise ValueError(f"GEMM frame lacks column(s) {lacking}; pass nslib.data.mixed_data."
                         "gemm_table() rows (m tokens, [m x k] @ [k x n])")
    return tuple(frame[c].to_numpy(float) for c in "mnk")


def _check_frame(frame: pd.DataFrame, train: bool) -> None:
    need = list(NEEDED) + (["latency_ms"] if train else [])
    lacking = [c for c in need if c not in frame.columns]
    if lacking:
        raise ValueError(f"GEMM frame lacks column(s) {lacking}; join the GPU datasheet "
                         "columns (nslib.data.mixed_data.gpu_frame)")
    bad = [c for c in need if not np.all(np.isfinite(frame[c].to_numpy(float)))
           or np.any(frame[c].to_numpy(float) <= 0)]
    if bad:
        raise ValueError(f"GEMM frame has missing or non-positive {bad}; a datasheet "
                         "without Bf16FLOPs cannot be predicted (add it to the JSON)")


# the law's terms: name -> (lower, upper) bound of the efficiency that divides it. ``dram``:
# a GEMM streams its DRAM traffic at no less than half the bandwidth. ``flat`` (the FLOPs
# unpadded at the peak) and ``sm`` (bytes per FP32 FLOP of the occupied SMs) are options the
# default leaves out (docs/decisions.md, "BF16 GEMMs").
TERMS = {"comp": (0.0, 1.0), "flat": (0.0, 1.0), "dram": (0.5, 1.0), "l2": (0.5, 4.0),
         "tile": (1.0, 16.0),
         "sm": (0.0, 1.0)}


def gemm_terms(frame: pd.DataFrame, l2: bool = True, macs: bool = False,
               rank: int = 0) -> dict[str, np.ndarray]:
    """Per GEMM: the chosen tiles' columns (:func:`nslib.kernels.tc_tiles.choose_tiles`; ``macs``:
    at the datasheet's BF16 multiply-adds per SM clock, else an A100-like SM's; ``rank``: the
    heuristic's ``rank``-th cheapest tile), and the
    law's physical terms in ms: ``comp`` (padded waves at the BF16 peak), ``dram`` (DRAM
    bytes at the bandwidth), ``l2`` (L2-resident bytes at the bandwidth), ``tile`` (the bytes
    the CTAs launched load through L2, at the DRAM bandwidth), ``sm`` (all bytes at one byte
    per FP32 FLOP of the occupied SMs), ``roof`` (the bound) and ``l2_ratio`` (bytes over L2
    bytes)."""
    m, n, k = _dims(frame)
    sm = frame["num_sm"].to_numpy(float)
    # the heuristic's tensor rate: a fixed A100-like SM, or the datasheet's per SM clock
    clock = frame["clock_mhz"].to_numpy(float)
    rate = frame["bf16_gflops"].to_numpy(float) * KILO / (FLOP_PER_MAC * sm * clock) if macs \
        else MACS
    tiles = choose_tiles(m, n, k, sm, rate, rank)
    tm, tn, waves = (tiles[c].to_numpy(float) for c in ("tile_m", "tile_n", "waves"))
    k_split = np.ceil(k / tiles["split"].to_numpy(float))
    peak = frame["bf16_gflops"].to_numpy(float) * GIGA
    bw = frame["mem_bw"].to_numpy(float) * GIGA
    l2_bytes = frame["l2_mb"].to_numpy(float) * MIB  # NVIDIA quotes L2 in binary MB
    nbytes = GEMM.bytes(frame)
    beyond = np.maximum(nbytes - l2_bytes, 0.0) if l2 else nbytes
    active = np.minimum(tiles["ctas"].to_numpy(float), sm) / sm
    out = {c: tiles[c].to_numpy(float) for c in tiles.columns}
    out.update(comp=FLOP_PER_MAC * waves * sm * tm * tn * k_split / peak * MS_PER_S,
               flat=GEMM.flops(frame) / peak * MS_PER_S, dram=beyond / bw * MS_PER_S,
               l2=(nbytes - beyond) / bw * MS_PER_S,
               tile=BYTES * tiles["ctas"].to_numpy(float) * k_split * (tm + tn) / bw * MS_PER_S,
               sm=nbytes / (active * frame["peak_gflops"].to_numpy(float) * GIGA) * MS_PER_S,
               roof=np.maximum(GEMM.flops(frame) / peak,
                               np.maximum(nbytes - l2_bytes, 0.0) / bw) * MS_PER_S,
               l2_ratio=nbytes / l2_bytes, m=m, n=n, k=k, num_sm=sm, k_split=k_split)
    return out


def law_ms(raw, ctx, terms, power=0.0, xp=np):
    """Latency (ms) from raw MLP outputs (n, 1 + len(terms)) and ``ctx`` (n, len(terms) + 2:
    the terms' ms, the roofline ms, the scale of c in ms): ``c + max_j(term_j / eff_j)``,
    ``c = exp(raw_0) * scale``, ``eff_j`` a sigmoid scaled to :data:`TERMS`; numpy or torch
    (``xp``) alike."""
    sig = (lambda x: 1 / (1 + np.exp(-x))) if xp is np else xp.sigmoid
    parts = []
    for j, name in enumerate(terms):
        lo, hi = TERMS[name]
        parts.append(ctx[:, j] / (lo + (hi - lo) * sig(raw[:, j + 1].clip(-SIGMOID_CLIP,
                                                                          SIGMOID_CLIP))))
    if power:  # a smooth maximum (p-norm, >= the max): every term gets a gradient
        top = parts[0]
        for q in parts[1:]:
            top = xp.maximum(top, q)
        body = top * sum((q / top) ** power for q in parts) ** (1.0 / power)
    else:
        body = parts[0]
        for q in parts[1:]:
            body = xp.maximum(body, q)
    n = len(terms)
    fixed = ctx[:, n + 1] * xp.exp(raw[:, 0].clip(-EXP_CLIP, EXP_CLIP))
    if raw.shape[1] > n + 1:  # a second fixed cost on its own scale (time and SM clocks)
        fixed = fixed + ctx[:, n + 2] * xp.exp(raw[:, n + 1].clip(-EXP_CLIP, EXP_CLIP))
    return xp.maximum(fixed + body, ctx[:, len(terms)])


@dataclass(frozen=True)
class GemmConfig:
    """Training settings. ``features``: MLP inputs (log2, standardised, clipped to the
    training range); ``terms``: the law's terms (:data:`TERMS`); ``power``: p of the smooth
    maximum (0: the plain max); ``members``: MLPs from different seeds, their times averaged
    in log; ``l2``: DRAM bytes beyond L2 only (False: all bytes); ``fixed``: the scale of c,
    ``"time"`` (2 us), ``"cycles"`` (4000 SM clocks) or ``"both"`` (one c of each, summed);
    ``macs``: the tile heuristic uses the datasheet's BF16 rate per SM clock (False: an
    A100-like SM); ``rows``: training rows kept, 0 = all, drawn uniformly per GPU (``even``:
    evenly over log2 FLOPs instead); ``epochs``, ``batch``, ``lr`` (cosine to 0), ``layers`` x
    ``hidden`` ReLU MLP. Prediction: the fastest launch over the heuristic's ``tiles_tried``
    cheapest tiles on the GPU and on it restricted to ``sm_fractions`` of its SMs
    (:meth:`TensorGemm._launches`; training prices the cheapest tile on the whole GPU)."""

    features: tuple = ("tile_m", "tile_n", "k_split", "l2_ratio", "m", "n", "k")
    terms: tuple = ("comp", "dram", "tile", "l2")
    power: float = 4.0
    members: int = 1
    l2: bool = True
    fixed: str = "both"
    macs: bool = True
    even: bool = False
    rows: int = 40000
    epochs: int = 40
    batch: int = 512
    lr: float = 3e-3
    weight_decay: float = 1e-4
    layers: int = 3
    hidden: int = 64
    tiles_tried: int = 2
    sm_fractions: tuple = tuple(2.0 ** (-j / 4) for j in range(1, 9))


QUICK = {"rows": 6000, "epochs": 12}


def training_sample(frame: pd.DataFrame, rows: int, seed: int, even: bool = True) -> np.ndarray:
    """Row indices of at most ``rows`` training GEMMs, the same share per GPU, each GPU's
    drawn uniformly or (``even``) evenly over log2 FLOPs (a size bin's rows with weight 1 / its
    count)."""
    rng = np.random.default_rng(seed)
    gpus = frame["gpu"].to_numpy()
    bins = np.floor(np.log2(GEMM.flops(frame))).astype(int)
    per = max(rows // max(len(set(gpus)), 1), 1) if rows else len(frame)
    keep = []
    for g in pd.unique(gpus):
        idx = np.flatnonzero(gpus == g)
        if len(idx) <= per:
            keep.append(idx)
            continue
        _, inv, counts = np.unique(bins[idx], return_inverse=True, return_counts=True)
        p = 1.0 / counts[inv] if even else np.ones(len(idx))
        keep.append(rng.choice(idx, size=per, replace=False, p=p / p.sum()))
    return np.sort(np.concatenate(keep))


class TensorGemm(Predictor):
    """nslib's BF16 GEMM predictor (bounded, after NeuSight): an MLP's bounded efficiencies times the
    tile/wave roofline law of the module docstring (``quick=True``: a small, fast fit)."""

    name = "nslib"
    description = "nslib's BF16 GEMM: bounded MLP efficiencies of a wave-quantised tensor-core law"

    def __init__(self, seed: int = 0, quick: bool = False, **config):
        self.seed = seed
        self.config = asdict(GemmConfig(**{**(QUICK if quick else {}), **config}))
        unknown = set(self.config["features"]) - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown GEMM feature(s) {sorted(unknown)}; known: {FEATURES}")
        if self.config["fixed"] not in ("time", "cycles", "both"):
            raise ValueError(f"fixed={self.config['fixed']!r}: use 'time', 'cycles' or 'both'")
        bad = set(self.config["terms"]) - set(TERMS)
        if bad or not self.config["terms"]:
            raise ValueError(f"unknown or no law terms {sorted(bad)}; known: {sorted(TERMS)}")
        self.weights: list[np.ndarray] = []
        self.norm: tuple[np.ndarray, ...] = ()

    def _context(self, frame: pd.DataFrame, rank: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(log2 features, law context (comp, dram, sm, roof) ms) of each row, at the
        heuristic's ``rank``-th cheapest tile."""
        terms = gemm_terms(frame, self.config["l2"], self.config["macs"], rank)
        feats = np.log2(np.column_stack([terms[f] for f in self.config["features"]]))
        # the fixed cost's scale: SM clocks at the datasheet clock (prologue, k-loop latency)
        cycles = FIXED_CYCLES / (frame["clock_mhz"].to_numpy(float) * KILO)
        time = np.full(len(frame), FIXED_MS)
        scales = {"time": [time], "cycles": [cycles], "both": [time, cycles]}[self.config["fixed"]]
        ctx = np.column_stack([terms[c] for c in (*self.config["terms"], "roof")] + scales)
        return feats, ctx

    def _inputs(self, feats: np.ndarray) -> np.ndarray:
        return standardise(feats, self.norm)

    def fit(self, frame: pd.DataFrame, progress: bool = True) -> "TensorGemm":
        _check_frame(frame, train=True)
        cfg = GemmConfig(**self.config)
        df = frame.iloc[training_sample(frame, cfg.rows, self.seed, cfg.even)]
        feats, ctx = self._context(df)
        self.norm = fit_scaling(feats)
        x = self._inputs(feats)
        y = df["latency_ms"].to_numpy(float)
        share = df.groupby("gpu")["gpu"].transform("size").to_numpy(float)
        w = 1.0 / share / np.mean(1.0 / share)  # every GPU weighs the same
        self.weights = [self._fit_member(cfg, x, ctx, y, w, self.seed + MEMBER_SEED_STRIDE * j,
                                        progress)
                        for j in range(cfg.members)]
        return self

    def _fit_member(self, cfg, x, ctx, y, w, seed, progress) -> list[np.ndarray]:
        """One MLP's weights, trained from ``seed`` on the |log error| of the law's time."""
        import torch
        terms, power = cfg.terms, cfg.power
        fit = Fit(hidden=cfg.hidden, layers=cfg.layers, epochs=cfg.epochs, batch=cfg.batch,
                  lr=cfg.lr, weight_decay=cfg.weight_decay,
                  n_out=1 + len(terms) + (cfg.fixed == "both"),
                  head=lambda raw, c: law_ms(raw, c, terms, power, torch), loss=log_error,
                  val_frac=0.0, schedule="onecycle", seed=seed)
        return fit_mlp(x, y, fit, ctx=ctx, weights=w, progress=progress, desc="tc-gemm")

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        """Latency in ms of each GEMM (row order), never below its roofline: the fastest of
        the launches the GPU can run (:meth:`_launches`)."""
        if not self.weights:
            raise ValueError("TensorGemm is not trained: call fit(gemm_table rows) first")
        _check_frame(frame, train=False)
        return np.min([self._predict_launch(f, r) for f, r in self._launches(frame)], axis=0)

    def _launches(self, frame: pd.DataFrame):
        """(frame, tile rank) of each launch tried: the heuristic's ``tiles_tried`` cheapest
        tiles on the GPU and on the GPU restricted to each of ``sm_fractions`` of its SMs
        (whole SMs, their share of the peaks; the whole L2 and bandwidth). A GPU can run a
        GEMM as a smaller one of its kind would, and a library picks its fastest launch; for
        a fixed tile more SMs only shorten the waves (the MLP's inputs do not depend on the
        SM count), so a GPU with more SMs is slower only where a grid point misses."""
        sm = frame["num_sm"].to_numpy(float)
        for f in (1.0, *self.config["sm_fractions"]):
            share = np.maximum(np.floor(sm * f), 1.0) / sm
            sub = frame if f == 1.0 else frame.assign(
                num_sm=sm * share, bf16_gflops=frame["bf16_gflops"].to_numpy(float) * share,
                peak_gflops=frame["peak_gflops"].to_numpy(float) * share)
            for rank in range(self.config["tiles_tried"]):
                yield sub, rank

    def _predict_launch(self, frame: pd.DataFrame, rank: int) -> np.ndarray:
        """Latency (ms) of each GEMM at the heuristic's ``rank``-th cheapest tile."""
        feats, ctx = self._context(frame, rank)
        z = self._inputs(feats)
        # an ensemble averages its members' times in log (geometric mean), still >= roofline
        logs = [np.log(law_ms(mlp_forward(w, z), ctx, self.config["terms"], self.config["power"]))
                for w in self.weights]
        return np.exp(np.mean(logs, axis=0))

    def get_state(self) -> dict:
        return {"seed": self.seed, "config": self.config, "weights": list(self.weights),
                "norm": list(self.norm)}

    def set_state(self, state: dict) -> None:
        self.seed = int(state["seed"])
        self.config = asdict(GemmConfig(**{**state["config"],
                                           "features": tuple(state["config"]["features"]),
                                           "terms": tuple(state["config"]["terms"]),
                                           "sm_fractions": tuple(state["config"].get(
                                               "sm_fractions", GemmConfig.sm_fractions))}))
        self.weights = [[np.asarray(a, np.float32) for a in w] for w in state["weights"]]
        self.norm = tuple(np.asarray(a, float) for a in state["norm"])
        n_in = len(self.config["features"])
        if self.weights[0][0].shape[1] != n_in or self.norm[0].shape != (n_in,):
            raise ValueError(f"weights take {self.weights[0][0].shape[1]} inputs, the config "
                             f"names {n_in} features")
