"""NeuSight's laws: how the MLP's raw outputs and a kernel's physical terms make its time.

Wave laws (the paper's family) give the utilisation ``u`` in (0, 1) of one wave of tiles, a
wave taking ``base / u`` with ``base`` one wave at the roofline:

- ``paper``: NeuSight's published law ``u = gamma - alpha' / waves`` (method.md section 4),
  written ``u = gamma * (1 - alpha / waves)`` with alpha and gamma sigmoids, i.e.
  ``alpha' = alpha * gamma`` < gamma: a free sigmoid alpha' above gamma would make ``u <= 0``
  on a one-wave kernel (no time at all), and at initialisation (both near 0.5) every one-wave
  kernel would start there. For waves >= 1 the two give the same utilisations in (0, gamma);
- ``overhead``: ``u = gamma * waves / (waves + a)``, ``a = exp(raw)`` a fixed cost in waves;
- ``additive``: ``waves * base / gamma + c`` for the kernel, ``c = exp(raw) * ADDITIVE_MS`` a
  fixed cost in time (a launch costs about the same whatever the GPU's bandwidth).

Kernel laws build the kernel's time from terms of the datasheet, each divided by a learned
efficiency, and never go below the kernel's own roofline (a partial last wave does not move a
full wave's bytes):

- ``stream`` (memory-bound classes): ``c + bytes / (gamma * bandwidth) + bytes / (kappa * FP32
  peak of the occupied SMs)``: the memory system and the SMs' own issue rate (Little's law: an
  SM keeps a bounded number of bytes in flight) are two ceilings in series;
- ``series`` (GEMMs): ``c + max(compute / gamma, bytes / (delta * bandwidth))``, delta in
  (0.5, 1), compute the waves of tiles at the FP32 peak: the tile pipeline overlaps loads with
  math, so the slower of the two sets the pace.

gamma, kappa, delta and c depend on the kernel's shape and SM count only (MLP inputs clipped
to the training range), so peak and bandwidth act through the physical terms alone and more of
either never makes a kernel slower (checked: :mod:`nslib.evaluation.extrapolation`). Why these
laws: docs/decisions.md.
"""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from nslib.data.units import GIGA, MS_PER_S
from nslib.kernels import sizes
from nslib.predictors.features import roofline_wave_ms
from nslib.predictors.network import EXP_CLIP, SIGMOID_CLIP

FORMS = ("paper", "overhead", "additive", "stream", "series")
# raw MLP outputs each law needs
OUTPUTS = {"paper": 2, "overhead": 2, "additive": 2, "stream": 3, "series": 3}
# Scale of the additive and stream forms' fixed cost: exp(raw) * 10 us, so raw = 0 is a
# typical launch.
ADDITIVE_MS = 0.01
# Scale of the stream form's SM-side rate: bytes an SM moves per FLOP of its FP32 peak
# (exp(raw) times this; 0.1 is ~18 GB/s for an SM of 180 GFLOP/s).
KAPPA = 0.1
# the series form's delta: at least this share of the bandwidth (why: docs/decisions.md)
MIN_GEMM_STREAM = 0.5
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
    per_sm = frame["peak_gflops"].to_numpy(float) * GIGA / sm
    waves = frame["waves"].to_numpy(float)
    cols = [roofline_wave_ms(frame), waves,
            nbytes / (frame["mem_bw"].to_numpy(float) * GIGA) * MS_PER_S,
            nbytes / (active * per_sm) * MS_PER_S,
            waves * frame["tile_flops"].to_numpy(float) / per_sm * MS_PER_S,
            sizes.roofline_ms(frame)]
    return np.column_stack(cols).astype(float)


class _NumpyOps:
    """The few array functions the laws use, for numpy arrays (torch has them by name)."""

    exp, maximum, stack = staticmethod(np.exp), staticmethod(np.maximum), staticmethod(np.stack)

    @staticmethod
    def sigmoid(x: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-x))


def array_ops(raw):
    """``torch`` for a tensor (training needs its gradients), else numpy: the laws are
    written once over either, so prediction never needs torch."""
    torch = sys.modules.get("torch")  # a tensor means torch is imported already
    return torch if torch is not None and isinstance(raw, torch.Tensor) else _NumpyOps


def _one_wave_ms(raw, ctx, form: str):
    """Per-wave ms of one member from its raw outputs (see :func:`wave_ms`)."""
    xp = array_ops(raw)
    base, waves = ctx[:, 0], ctx[:, 1]

    def sig(j):  # clipped: < 1 in float64 even for unclipped inputs
        return xp.sigmoid(raw[:, j].clip(-SIGMOID_CLIP, SIGMOID_CLIP))

    def exp(j):
        return xp.exp(raw[:, j].clip(-EXP_CLIP, EXP_CLIP))

    gamma = sig(1)
    if form == "paper":
        return base / (gamma * (1 - sig(0) / waves))
    if form == "overhead":
        return base * (waves + exp(0)) / (gamma * waves)
    if form == "additive":
        return base / gamma + ADDITIVE_MS * exp(0) / waves
    if form == "stream":
        total = ADDITIVE_MS * exp(0) + ctx[:, 2] / gamma + ctx[:, 3] / (KAPPA * exp(2))
        return xp.maximum(total, ctx[:, 5]) / waves
    if form == "series":
        delta = MIN_GEMM_STREAM + (1 - MIN_GEMM_STREAM) * sig(2)
        total = ADDITIVE_MS * exp(0) + xp.maximum(ctx[:, 4] / gamma, ctx[:, 2] / delta)
        return xp.maximum(total, ctx[:, 5]) / waves
    raise ValueError(f"unknown NeuSight form {form!r}; known: {FORMS}")


def wave_ms(raw, ctx, form: str):
    """Predicted ms of one wave (float64) from the MLP's raw outputs under law ``form`` (module
    docstring); ``ctx``: the kernels' :func:`wave_context`. The kernel takes ``waves`` times
    this. ``raw`` and ``ctx`` are both numpy arrays (prediction) or both torch tensors
    (training). Raw outputs wider than the law's are an ensemble's members side by side: their
    utilisations ``base / wave_ms`` are averaged.
    """
    k = OUTPUTS[form] if form in OUTPUTS else 2
    if raw.shape[1] > k:
        base = ctx[:, 0]
        u = array_ops(raw).stack([base / _one_wave_ms(raw[:, j:j + k], ctx, form)
                                  for j in range(0, raw.shape[1], k)]).mean(0)
        return base / u
    return _one_wave_ms(raw, ctx, form)
