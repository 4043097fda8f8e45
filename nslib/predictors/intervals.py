"""Intervals for kernel predictions, calibrated on GPUs the predictor never saw.

**Residuals.** For each training GPU in turn, the predictor trained without it (a
leave-one-GPU-out fold, cached like any predictor) predicts that GPU's test kernels, tiles
looked up as on a GPU never profiled; a residual is ``r = log(predicted / measured)``
(:func:`logo_residuals`, cached by the predictor's own cache key).

**Split-conformal, per class** (:class:`Calibration`). For a central interval of coverage
``1 - a`` the class's residuals give the lower and upper quantiles ``r_lo``, ``r_hi`` at
levels ``a / 2`` and ``1 - a / 2``, with the finite-sample rank ``ceil((n + 1) q)`` of split
conformal prediction, every held-out GPU weighing the same (a GPU with many kernels does not
set the quantiles alone). A kernel predicted at ``p`` then lies in ``[p e^-r_hi, p e^-r_lo]``.
What this gives: the ranks are those of split conformal prediction over kernels, whose
coverage guarantee assumes the new kernels exchangeable with the calibration kernels. Kernels
of one GPU are not independent draws (a GPU's errors share its bias), and the GPUs that are
the real draws number only a few: a GPU-level guarantee at 80% would need the extreme
residual of the class, or more GPUs. So the coverage is an empirical claim, checked by
:func:`nested_coverage` (each GPU against the calibration of the others), not a theorem.

**A step** (:meth:`Calibration.step_interval`): the kernels of one GPU err together (a GPU's
bandwidth or clock misjudged moves all its kernels), so their errors are not averaged as if
independent. The step's bounds add the class bounds comonotonically: ``lo = sum_c T_c
e^-r_hi(c)``, ``hi = sum_c T_c e^-r_lo(c)`` for the classes' predicted times ``T_c``: the
exact quantiles of a sum whose terms move together, the widest honest combination. Rows
without a calibration (communication, classes the predictor was not checked on) keep their
prediction as both bounds. Units: ms.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from nslib import __version__
from nslib.data.cache import JSON, cached, read_cache_entry
from nslib.data.mixed_data import mixed_hash
from nslib.data.paths import cache_dir, hash_files
from nslib.data.settings import Settings
from nslib.data.sources import code_digest, dependencies
from nslib.kernels import measured, sizes
from nslib.predictors import folds, predictor_class
from nslib.predictors.mixed_training import KINDS, kind_table
from nslib.predictors.training import cache_key, kernel_eval_frame, params_for

COVERAGE = 0.8     # default central coverage of an interval
# kernel classes of a model frame priced like a measured class (memory copies as elementwise)
CLASS_OF = {"memory": "elementwise"}


def _key(name: str, quick: bool, seed: int, data=None) -> str:
    # the folds' own key (their code, data and parameters), the test tables and this module's
    # code: an edited calibration or residual never reuses a stale one
    return cache_key(name, {**params_for(name, quick, seed), "residuals": 1,
                            "test": [measured.table_key(c, "test", data) for c in sizes.CLASSES],
                            "calibration code": code_digest([__file__])}, data)


def logo_residuals(name: str = "nslib", data=None, quick: bool = False, seed: int = 0,
                   progress: bool = False) -> pd.DataFrame:
    """``gpu, cls, pred_ms, latency_ms, r`` (``r = log(pred / measured)``) of every training
    GPU's test kernels, each predicted by the fold that never saw that GPU (cached)."""
    def build():
        frame = kernel_eval_frame(data)
        parts = []
        settings = Settings(data=data, quick=quick, seed=seed, progress=progress)
        for g, pred in folds(name, settings):
            sub = frame[frame["gpu"] == g]
            if not len(sub):
                continue
            p = pred.predict(sub, lookup=True) if hasattr(pred, "tiles") else pred.predict(sub)
            parts.append(pd.DataFrame({"gpu": g, "cls": sub["cls"].to_numpy(),
                                       "pred_ms": np.asarray(p, float),
                                       "latency_ms": sub["latency_ms"].to_numpy(float)}))
        return _log_ratios(pd.concat(parts, ignore_index=True))
    return cached("tables", f"residuals-{name}-{_key(name, quick, seed, data)}", build,
                  f"{name} leave-one-GPU-out residuals")


def weighted_quantile(r: np.ndarray, w: np.ndarray, q: float) -> float:
    """The conformal quantile of ``r`` at level ``q`` with weights ``w`` (summing to n): the
    smallest value whose weight at or below it reaches ``ceil((n + 1) q)`` (clipped to the
    extremes when the sample is too small for that rank)."""
    order = np.argsort(r)
    r, w = r[order], w[order]
    n = float(w.sum())
    rank = np.ceil((n + 1.0) * q) if q >= 0.5 else np.floor((n + 1.0) * q)
    cum = np.cumsum(w)
    i = int(np.searchsorted(cum, min(max(rank, 1.0), n) - 1e-9))
    return float(r[min(i, len(r) - 1)])


def _gpu_weights(gpus: pd.Series) -> np.ndarray:
    """Weights making every GPU count the same, summing to the number of rows."""
    counts = gpus.map(gpus.value_counts()).to_numpy(float)
    k = gpus.nunique()
    return len(gpus) / (k * counts)


@dataclass(frozen=True)
class Calibration:
    """Per class, the residual quantiles ``(r_lo, r_hi)`` of a central ``coverage`` interval
    (see the module doc); ``n``: residuals and ``gpus`` held-out GPUs behind each class."""

    predictor: str
    coverage: float
    bounds: dict = field(default_factory=dict)
    n: dict = field(default_factory=dict)
    gpus: tuple = ()

    @classmethod
    def fit(cls, residuals: pd.DataFrame, coverage: float = COVERAGE, predictor: str = ""):
        if not 0 < coverage < 1:
            raise ValueError(f"coverage must lie strictly between 0 and 1, got {coverage}")
        a = 1.0 - coverage
        bounds, n = {}, {}
        for c, g in residuals.groupby("cls"):
            r, w = g["r"].to_numpy(float), _gpu_weights(g["gpu"])
            bounds[c] = (weighted_quantile(r, w, a / 2), weighted_quantile(r, w, 1 - a / 2))
            n[c] = int(len(g))
        return cls(predictor, float(coverage), bounds, n,
                   tuple(sorted(residuals["gpu"].unique())))

    def factors(self, classes) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) multipliers of the prediction for each class name (1 where the
        class has no calibration)."""
        names, idx = np.unique(np.asarray(list(classes), dtype=object).astype(str),
                               return_inverse=True)
        lo, hi = np.ones(len(names)), np.ones(len(names))
        for i, c in enumerate(names):
            b = self.bounds.get(CLASS_OF.get(c, c))
            if b is not None:
                lo[i], hi[i] = np.exp(-b[1]), np.exp(-b[0])
        return lo[idx.ravel()], hi[idx.ravel()]

    def kernel_interval(self, classes, pred_ms) -> tuple[np.ndarray, np.ndarray]:
        """Per kernel (``classes``, predicted ``pred_ms``): the interval's bounds, ms."""
        lo, hi = self.factors(list(classes))
        p = np.asarray(pred_ms, float)
        return p * lo, p * hi

    def step_interval(self, per_class_ms: dict) -> tuple[float, float]:
        """A step's bounds (ms) from its predicted time per class, the classes comonotone."""
        names = list(per_class_ms)
        t = np.array([per_class_ms[c] for c in names], float)
        lo, hi = self.factors(names)
        return float((t * lo).sum()), float((t * hi).sum())

    def step_bounds(self, per_class_ms: dict, step_ms: float) -> tuple[float, float] | None:
        """Bounds (ms) of a step of ``step_ms``: the comonotone class bounds' ratio to the
        classes' plain sum, applied to the step (so a schedule's overlap or a host-bound
        floor scales with it); None when the classes sum to nothing."""
        total = sum(per_class_ms.values())
        if total <= 0:
            return None
        lo, hi = self.step_interval(per_class_ms)
        return step_ms * lo / total, step_ms * hi / total

    def to_dict(self) -> dict:
        return {"predictor": self.predictor, "coverage": self.coverage,
                "bounds": {c: list(b) for c, b in self.bounds.items()}, "n": self.n,
                "gpus": list(self.gpus)}

    @classmethod
    def from_dict(cls, d: dict):
        return cls(d["predictor"], float(d["coverage"]),
                   {c: tuple(b) for c, b in d["bounds"].items()}, dict(d["n"]),
                   tuple(d["gpus"]))


def calibration(name: str = "nslib", data=None, quick: bool = False, seed: int = 0,
                coverage: float = COVERAGE, build: bool = True,
                progress: bool = False) -> Calibration | None:
    """The :class:`Calibration` of predictor ``name`` (cached). ``build=False``: None unless
    it is already in the cache (a prediction never trains the folds behind the caller's
    back)."""
    key = f"calibration-{name}-{_key(name, quick, seed, data)}-{coverage:g}"
    return _cached_calibration(key, lambda: logo_residuals(name, data, quick, seed, progress),
                               coverage, name, build)


def _cached_calibration(key: str, residuals, coverage: float, name: str,
                        build: bool) -> Calibration | None:
    """The calibration cached under ``key``, fitted on ``residuals()`` when missing (and
    ``build``)."""
    if not build:
        got = read_cache_entry(cache_dir("tables") / f"{key}.json", JSON.read, "calibration")
        return Calibration.from_dict(got) if got is not None else None
    made = cached("tables", key, lambda: Calibration.fit(residuals(), coverage, name).to_dict(),
                  f"{name} interval calibration", JSON)
    return Calibration.from_dict(made)


def _log_ratios(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (``pred_ms``, ``latency_ms``) with ``r = log(pred / measured)``, rows
    without two positive times left out."""
    ok = (frame["pred_ms"] > 0) & (frame["latency_ms"] > 0)
    return frame[ok].assign(r=np.log(frame["pred_ms"] / frame["latency_ms"])[ok]) \
        .reset_index(drop=True)


def _tensor_key(name: str, quick: bool, seed: int, coverage, mixed=None) -> str:
    # the code of this module and of the kinds' predictors: an edited 16-bit predictor never
    # reuses stale bounds
    sources = dependencies(__name__, *(predictor_class(name, k).__module__ for k in KINDS))
    return hash_files([], extra=[code_digest(sources), name, quick, seed, coverage,
                                 mixed_hash(mixed), __version__, "tensor-calibration"])


def tensor_residuals(name: str = "nslib", quick: bool = False, seed: int = 0, mixed=None,
                     progress: bool = False) -> pd.DataFrame:
    """``gpu, cls, pred_ms, latency_ms, r`` of the 16-bit kinds (``cls`` ``gemm`` or
    ``attention``): each measured GPU's rows predicted by the kind's predictor trained on the
    other GPUs (:func:`nslib.predictors.folds`, cached per fold)."""
    parts = []
    settings = Settings(quick=quick, seed=seed, progress=progress, mixed=mixed)
    for kind in KINDS:
        table = kind_table(kind, quick, mixed)
        for g, pred in folds(name, settings, kind=kind, table=table):
            rows = table[table["gpu"] == g].reset_index(drop=True)
            parts.append(pd.DataFrame({"gpu": g, "cls": kind,
                                       "pred_ms": np.asarray(pred.predict(rows), float),
                                       "latency_ms": rows["latency_ms"].to_numpy(float)}))
    return _log_ratios(pd.concat(parts, ignore_index=True))


def tensor_calibration(name: str = "nslib", quick: bool = False, seed: int = 0,
                       coverage: float = COVERAGE, mixed=None, build: bool = True,
                       progress: bool = False) -> Calibration | None:
    """The :class:`Calibration` of the 16-bit GEMM and attention predictors ``name`` (classes
    ``gemm``, ``attention``), cached; ``build=False`` as in :func:`calibration`."""
    key = f"calibration16-{name}-{_tensor_key(name, quick, seed, coverage, mixed)}"
    return _cached_calibration(key, lambda: tensor_residuals(name, quick, seed, mixed,
                                                             progress), coverage, name, build)


def nested_coverage(residuals: pd.DataFrame, coverage: float = COVERAGE) -> pd.DataFrame:
    """Out-of-sample check: each held-out GPU's kernels against the calibration of the other
    GPUs' residuals. Per class and GPU: ``covered`` (share inside, %) and ``half_width``
    (half the interval's width, % of the prediction)."""
    rows = []
    for g in sorted(residuals["gpu"].unique()):
        cal = Calibration.fit(residuals[residuals["gpu"] != g], coverage)
        mine = residuals[residuals["gpu"] == g]
        for c, sub in mine.groupby("cls"):
            if c not in cal.bounds:
                continue
            r_lo, r_hi = cal.bounds[c]
            inside = (sub["r"] >= r_lo) & (sub["r"] <= r_hi)
            rows.append({"gpu": g, "cls": c, "n": len(sub), "covered": 100 * inside.mean(),
                         "half_width": 50 * (np.exp(-r_lo) - np.exp(-r_hi))})
    return pd.DataFrame(rows)


def mape_band_coverage(residuals: pd.DataFrame) -> pd.DataFrame:
    """The baseline a calibrated interval must beat: each held-out GPU's kernels against
    ``prediction +- the other GPUs' mean APE`` of the class (the error a table reports, used
    as a band). Same columns as :func:`nested_coverage`."""
    rows = []
    err = residuals.assign(ape=np.abs(residuals["pred_ms"] / residuals["latency_ms"] - 1))
    for g in sorted(err["gpu"].unique()):
        others = err[err["gpu"] != g].groupby("cls")["ape"].mean()
        for c, sub in err[err["gpu"] == g].groupby("cls"):
            if c not in others:
                continue
            m = others[c]
            y, p = sub["latency_ms"], sub["pred_ms"]
            inside = (y >= p * (1 - m)) & (y <= p * (1 + m))
            rows.append({"gpu": g, "cls": c, "n": len(sub), "covered": 100 * inside.mean(),
                         "half_width": 100 * m})
    return pd.DataFrame(rows)


__all__ = ["COVERAGE", "Calibration", "calibration", "logo_residuals", "mape_band_coverage",
           "nested_coverage", "tensor_calibration", "tensor_residuals", "weighted_quantile"]
