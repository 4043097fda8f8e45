"""Plain regressors on NeuSight's features, without its roofline bound (method.md section 7).

Both predict ``ln(latency in ms)`` with one model per kernel class from

- NeuSight's four per-SM-normalised tile features (:func:`nslib.predictors.features.tile_features`),
- ``log2`` FLOPs and ``log2`` bytes (:func:`nslib.kernels.sizes.flops_bytes`),
- ``log2`` of the class's dims (``B, M, N, K`` for GEMMs, ``B, H`` for vector ops),
- ``log2`` of the GPU datasheet columns (``num_sm, peak_gflops, mem_bw, mem_gb, l2_mb``).

Kernels without a tile (traced models, unprofiled GPUs) take the tile of the nearest measured
training kernel (NeuSight's :class:`nslib.kernels.tiles.TileLookup`, fitted on the training frame).

- :class:`LinearRegression`: least squares on standardised features (minimum-norm solution:
  log FLOPs is an exact linear combination of the log dims, so the design is rank deficient).
- :class:`XGBoost`: gradient-boosted trees (``xgboost``, ``hist``), early stopping on a 20 %
  validation split. Trees cannot extrapolate: a kernel on a GPU faster than any in training
  gets at best the fastest training GPU's latency.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from nslib.kernels import sizes
from nslib.kernels.measured import GEMM_DIMS, VEC_DIMS
from nslib.kernels.tiles import TileLookup
from nslib.predictors.base import Predictor, by_class, with_defaults
from nslib.predictors.features import tile_features
from nslib.predictors.fitting import random_split
from nslib.predictors.scaling import mean_std


def regression_features(frame: pd.DataFrame, cls: str) -> np.ndarray:
    """The (n, d) float64 feature matrix of class ``cls`` (needs tiles and derived columns)."""
    flops, nbytes = sizes.flops_bytes(frame)
    dims = GEMM_DIMS if cls in sizes.GEMM_CLASSES else VEC_DIMS
    extra = np.log2(np.column_stack([flops, nbytes] + [frame[c].to_numpy(float) for c in dims]
                                    + [frame[c].to_numpy(float) for c in sizes.GPU_COLS]))
    return np.column_stack([tile_features(frame), extra])


class _PerClassRegressor(Predictor):
    """Shared plumbing: tiles, features, one model per class, log-latency target."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.tiles = TileLookup()

    def with_tiles(self, frame: pd.DataFrame, lookup: bool = False) -> pd.DataFrame:
        """``frame`` with tiles (parsed kept, missing looked up) and derived columns."""
        return self.tiles.fill(frame, lookup_all=lookup)

    def fit(self, frame: pd.DataFrame, progress: bool = True):
        self.tiles.fit(frame)
        frame = self.with_tiles(frame)
        for i, (cls, _, sub) in enumerate(by_class(frame)):
            X = regression_features(sub, cls)
            y = np.log(sub["latency_ms"].to_numpy(float))
            self._fit_class(cls, X, y, self.seed + i, progress)
        return self

    def predict(self, frame: pd.DataFrame, lookup: bool = False) -> np.ndarray:
        """Latency in ms per row; ``lookup=True`` ignores parsed tiles and looks all up."""
        frame = self.with_tiles(frame, lookup=lookup)
        out = np.empty(len(frame))
        for cls, idx, sub in by_class(frame):
            if cls not in self.models:
                raise ValueError(f"{self.name} has no trained {cls} model; train it first")
            out[idx] = np.exp(self._predict_class(cls, regression_features(sub, cls)))
        return out


class LinearRegression(_PerClassRegressor):
    name = "linreg"
    description = "Linear regression of log latency on NeuSight's features + log dims/GPU specs"

    def __init__(self, seed: int = 0):
        """``seed`` is accepted for interface uniformity; least squares is deterministic."""
        super().__init__(seed)
        self.models: dict[str, dict] = {}

    def _fit_class(self, cls, X, y, seed, progress) -> None:
        mean, std = mean_std(X)
        A = np.column_stack([np.ones(len(X)), (X - mean) / std])
        w, *_ = np.linalg.lstsq(A, y, rcond=None)
        self.models[cls] = {"mean": mean, "std": std, "w": w}

    def _predict_class(self, cls, X) -> np.ndarray:
        m = self.models[cls]
        return m["w"][0] + ((X - m["mean"]) / m["std"]) @ m["w"][1:]

    def get_state(self) -> dict:
        return {"seed": self.seed, "tiles": self.tiles.get_state(),
                "models": {c: {k: torch.from_numpy(v) for k, v in m.items()}
                           for c, m in self.models.items()}}

    def set_state(self, state: dict) -> None:
        self.seed = state["seed"]
        self.tiles = TileLookup.from_state(state["tiles"])
        self.models = {c: {k: v.numpy() for k, v in m.items()}
                       for c, m in state["models"].items()}


class XGBoost(_PerClassRegressor):
    name = "xgboost"
    description = "Gradient-boosted trees (XGBoost) on NeuSight's features + log dims/GPU specs"

    # boosting rounds (at most; early stop ``patience`` rounds after the best validation
    # error on a ``val_frac`` share), learning rate, tree depth, row and column subsampling,
    # threads
    DEFAULTS = {"rounds": 600, "lr": 0.1, "max_depth": 8, "subsample": 0.8, "colsample": 0.8,
                "patience": 30, "val_frac": 0.2, "n_jobs": 2}

    def __init__(self, seed: int = 0, **params):
        """``params``: changes to :attr:`DEFAULTS`; an unknown name is a TypeError."""
        super().__init__(seed)
        self.params = with_defaults("XGBoost", self.DEFAULTS, params)
        self.models: dict = {}
        self.best_rounds: dict[str, int] = {}

    def _booster_params(self, seed: int) -> dict:
        p = self.params
        return {"objective": "reg:squarederror", "eta": p["lr"], "max_depth": p["max_depth"],
                "subsample": p["subsample"], "colsample_bytree": p["colsample"],
                "tree_method": "hist", "nthread": p["n_jobs"], "seed": seed,
                "eval_metric": "rmse"}

    def _fit_class(self, cls, X, y, seed, progress) -> None:
        import xgboost as xgb
        p = self.params
        val, tr = random_split(np.random.default_rng(seed), len(X), p["val_frac"],
                               validate_on_train=True)
        dtr = xgb.DMatrix(X[tr], label=y[tr], nthread=p["n_jobs"])
        dval = xgb.DMatrix(X[val], label=y[val], nthread=p["n_jobs"])
        booster = xgb.train(self._booster_params(seed), dtr, num_boost_round=p["rounds"],
                            evals=[(dval, "val")], early_stopping_rounds=p["patience"],
                            verbose_eval=False)
        best = int(getattr(booster, "best_iteration", booster.num_boosted_rounds() - 1))
        self.models[cls] = booster[: best + 1]  # keep only the rounds up to the best
        self.best_rounds[cls] = best + 1

    def _predict_class(self, cls, X) -> np.ndarray:
        import xgboost as xgb
        d = xgb.DMatrix(X, nthread=self.params["n_jobs"])
        return self.models[cls].predict(d).astype(float)

    def get_state(self) -> dict:
        raw = {c: torch.from_numpy(np.frombuffer(bytes(b.save_raw("json")), np.uint8).copy())
               for c, b in self.models.items()}
        return {"seed": self.seed, "params": self.params, "tiles": self.tiles.get_state(),
                "boosters": raw, "best_rounds": self.best_rounds}

    def set_state(self, state: dict) -> None:
        import xgboost as xgb
        self.seed, self.params = state["seed"], dict(state["params"])
        self.tiles = TileLookup.from_state(state["tiles"])
        self.best_rounds = dict(state["best_rounds"])
        self.models = {}
        for c, t in state["boosters"].items():
            b = xgb.Booster(params={"nthread": self.params["n_jobs"]})
            b.load_model(bytearray(t.numpy().tobytes()))
            self.models[c] = b
