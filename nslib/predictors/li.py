"""Li et al. baseline ("micro" in the NeuSight data), method.md section 7.

Per training GPU and kernel class a linear model ``latency_ms = a + b * x`` with ``x`` the
kernel's FLOPs (bmm, linear) or bytes moved (elementwise, softmax, layernorm), computed from the
dims (:func:`nslib.kernels.sizes.flops_bytes`), so no tile is needed. Then, across the training GPUs,
each coefficient is regressed on GPU datasheet features to give the coefficients of a GPU that
was never measured:

    ln a = w0 + sum_f w_f * ln(feature_f),   ln b likewise,

ridge-regularised (on standardised log features, intercept unpenalised) because there are only
as many points as training GPUs (5 in the paper's split) for 1 + len(features) weights; the
default features are ``peak_gflops`` and ``mem_bw``. Regressing the logs keeps every
forecast coefficient positive and makes ``b`` scale as a power of peak / bandwidth, which is
how time per FLOP or per byte behaves.

A GPU whose datasheet columns equal a training GPU's uses that GPU's own fit
(``use_measured=True``, the default): it was measured, so nothing needs forecasting.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from nslib.kernels import sizes
from nslib.predictors.base import Predictor, by_class
from nslib.predictors.scaling import mean_std

MIN_INTERCEPT_MS = 1e-3   # 1 us: below any measured kernel (launch overhead alone is ~5 us)
MIN_SLOPE_FRAC = 1e-6     # slope floor, relative to the median of latency / x


def fit_per_gpu(x, y, weighted: bool = True) -> tuple[float, float]:
    """Least-squares ``y = a + b * x``; returns ``(a, b)`` (unclamped, may be negative).

    ``weighted=True`` minimises the squared *relative* residual ``sum(((y - a - b x) / y)**2)``
    (weighted least squares with weights ``1 / y**2``). That is what the evaluation metric
    (mean absolute percentage error) rewards: the measured latencies span four to five orders
    of magnitude, and an unweighted fit is set by the few largest kernels, leaving an
    intercept (often negative) that is wrong by multiples for the many small ones.
    ``x`` is rescaled internally, so FLOP counts of 1e13 are solved as accurately as small ones.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError(f"fit_per_gpu needs two 1-d arrays of equal length >= 2, got shapes "
                         f"{x.shape} and {y.shape}")
    if weighted and not (y > 0).all():
        raise ValueError("weighted fit needs positive latencies y")
    sx = float(np.max(np.abs(x))) or 1.0
    w = 1.0 / y if weighted else np.ones_like(y)
    A = np.column_stack([np.ones_like(x), x / sx]) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(A, y * w, rcond=None)
    return float(a), float(b / sx)


def clamp_coefficients(a: float, b: float, x, y) -> tuple[float, float, bool]:
    """Clamp a per-GPU fit to physically meaningful values; returns ``(a, b, clamped)``.

    A negative or tiny intercept (latency below zero for a small kernel) becomes
    :data:`MIN_INTERCEPT_MS`; a non-positive slope (latency falling with more work) becomes
    :data:`MIN_SLOPE_FRAC` times the median ``y / x``. Both must be positive for the log-space
    regression across GPUs.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    b_min = MIN_SLOPE_FRAC * float(np.median(y / np.maximum(x, 1.0)))
    a2, b2 = max(a, MIN_INTERCEPT_MS), max(b, b_min)
    return a2, b2, (a2 != a) or (b2 != b)


def ridge_fit(F: np.ndarray, t: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray,
                                                                   np.ndarray]:
    """Ridge regression of ``t`` on the columns of ``F`` (standardised; intercept free).

    Returns ``(mean, std, w)`` with ``w[0]`` the intercept: ``t ~ w0 + ((F - mean)/std) @ w[1:]``.
    """
    mean, std = mean_std(F)
    Z = (F - mean) / std
    X = np.column_stack([np.ones(len(Z)), Z])
    P = alpha * np.eye(X.shape[1])
    P[0, 0] = 0.0
    w = np.linalg.solve(X.T @ X + P, X.T @ t)
    return mean, std, w


class LiEtAl(Predictor):
    name = "li"
    description = ("Li et al.: per-GPU linear latency in FLOPs (GEMM) or bytes, coefficients "
                   "regressed on GPU features")

    def __init__(self, features=("peak_gflops", "mem_bw"), ridge: float = 1e-2,
                 weighted: bool = True, use_measured: bool = True, seed: int | None = None):
        """``seed`` is accepted for interface uniformity; the fit is deterministic."""
        unknown = set(features) - set(sizes.GPU_COLS)
        if unknown:
            raise ValueError(f"unknown GPU feature(s) {sorted(unknown)}; known: "
                             f"{sizes.GPU_COLS}")
        self.params = {"features": list(features), "ridge": float(ridge),
                       "weighted": bool(weighted), "use_measured": bool(use_measured)}
        self.per_gpu: dict[str, dict] = {}   # cls -> {"gpu", "specs", "a", "b", "clamped"}
        self.coef: dict[str, dict] = {}      # cls -> {"a": (mean, std, w), "b": (...)}

    # ----- training
    def fit(self, frame: pd.DataFrame, progress: bool = True) -> "LiEtAl":
        feats = self.params["features"]
        for cls, _, sub in by_class(frame):
            x_all = self._x(cls, sub)
            y_all = sub["latency_ms"].to_numpy(float)
            rows = []
            for gpu, g in sub.groupby("gpu", sort=True):
                m = (sub["gpu"] == gpu).to_numpy()
                a, b = fit_per_gpu(x_all[m], y_all[m], self.params["weighted"])
                a, b, clamped = clamp_coefficients(a, b, x_all[m], y_all[m])
                rows.append({"gpu": str(gpu),
                             "specs": [float(g[c].iloc[0]) for c in sizes.GPU_COLS],
                             "a": a, "b": b, "clamped": bool(clamped)})
            self.per_gpu[cls] = {k: [r[k] for r in rows] for k in rows[0]}
            F = np.log(np.array([[r["specs"][sizes.GPU_COLS.index(f)] for f in feats]
                                 for r in rows]))
            self.coef[cls] = {k: ridge_fit(F, np.log([r[k] for r in rows]),
                                           self.params["ridge"]) for k in ("a", "b")}
        return self

    @staticmethod
    def _x(cls: str, frame: pd.DataFrame) -> np.ndarray:
        flops, nbytes = sizes.flops_bytes(frame)
        return flops if cls in sizes.GEMM_CLASSES else nbytes

    # ----- prediction
    def coefficients(self, cls: str, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """``(a, b)`` per row of ``frame`` for class ``cls`` (measured fit or forecast)."""
        if cls not in self.coef:
            raise ValueError(f"li has no trained {cls} model; train it first")
        F = np.log(np.column_stack([frame[f].to_numpy(float) for f in self.params["features"]]))
        out = []
        for k in ("a", "b"):
            mean, std, w = self.coef[cls][k]
            out.append(np.exp(w[0] + ((F - mean) / std) @ w[1:]))
        a, b = out
        if self.params["use_measured"]:
            specs = np.column_stack([frame[c].to_numpy(float) for c in sizes.GPU_COLS])
            pg = self.per_gpu[cls]
            for s, ga, gb in zip(pg["specs"], pg["a"], pg["b"]):
                same = np.all(specs == np.asarray(s), axis=1)
                a[same], b[same] = ga, gb
        return a, b

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        sizes.validate_dims(frame)
        out = np.empty(len(frame))
        for cls, idx, sub in by_class(frame):
            a, b = self.coefficients(cls, sub)
            out[idx] = a + b * self._x(cls, sub)
        return out

    # ----- persistence
    def get_state(self) -> dict:
        return {"params": self.params, "per_gpu": self.per_gpu,
                "coef": {c: {k: [torch.from_numpy(np.asarray(v, float)) for v in t]
                             for k, t in d.items()} for c, d in self.coef.items()}}

    def set_state(self, state: dict) -> None:
        self.params = dict(state["params"])
        self.per_gpu = state["per_gpu"]
        self.coef = {c: {k: tuple(v.numpy() for v in t) for k, t in d.items()}
                     for c, d in state["coef"].items()}
