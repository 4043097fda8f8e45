"""Baselines for the 16-bit kernel classes, generic over a *kind* (BF16 GEMMs, attention).

A kind says what a kernel costs physically: ``flops(frame)`` (FLOP), ``bytes(frame)`` (minimum
DRAM bytes), ``shape_features(frame)`` (the kernel's raw shape inputs, positive) and ``name``.
Peak is the datasheet's dense tensor-core rate (``bf16_gflops``, GFLOP/s), bandwidth
``mem_bw`` (GB/s).

- :class:`Roofline`: ``max(flops / peak, bytes / bandwidth)``; nothing learned.
- :class:`RooflineEfficiency`: the roofline divided by one efficiency fitted over the training
  GPUs, the way analytic tools (llm-analysis, LLM-Viewer, GenZ) apply a hand-set one.
- :class:`XGBoostBaseline`: trees on log shapes and log datasheet figures, predicting log ms.
- :class:`MLPBaseline`: an unbounded MLP on the same inputs, predicting log ms.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.data.units import GIGA, MS_PER_S
from nslib.predictors.base import Predictor
from nslib.predictors.fitting import Fit, fit_mlp
from nslib.predictors.network import mlp_forward

DATASHEET = ("num_sm", "bf16_gflops", "mem_bw", "l2_mb")  # learned baselines see these
XGB_THREADS = 2    # XGBoost's threads, training and predicting
MIN_STD = 1e-6     # the MLP baseline's floor under an input column's spread (log2 units)


def roofline_ms(kind, frame: pd.DataFrame) -> np.ndarray:
    """The kind's roofline time of each row, ms: ``max(FLOP / peak, bytes / bandwidth)``."""
    peak = frame["bf16_gflops"].to_numpy(float) * GIGA
    if not np.isfinite(peak).all():
        bad = frame.loc[~np.isfinite(peak), "gpu"].unique().tolist()
        raise ValueError(f"GPU(s) {bad} have no 'Bf16FLOPs' in their datasheet; a 16-bit "
                         "prediction needs the tensor-core peak: add it to the JSON file")
    bw = frame["mem_bw"].to_numpy(float) * GIGA
    flops = np.asarray(kind.flops(frame), float)
    return MS_PER_S * np.maximum(flops / peak, np.asarray(kind.bytes(frame), float) / bw)


def learned_inputs(kind, frame: pd.DataFrame) -> np.ndarray:
    """log2 of the kind's shape features and of the datasheet figures, (n, d) float64."""
    cols = [np.asarray(kind.shape_features(frame), float),
            frame[list(DATASHEET)].to_numpy(float)]
    return np.log2(np.concatenate(cols, axis=1))


class KindPredictor(Predictor):
    """Holds the kind; the CLI and the registry make one per (kind, seed)."""

    def __init__(self, kind, seed: int = 0):
        self.kind, self.seed = kind, seed


class Roofline(KindPredictor):
    name = "roofline"
    description = "Tensor-core roofline: max(FLOP / BF16 peak, bytes / bandwidth)"

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        return roofline_ms(self.kind, frame)


class RooflineEfficiency(KindPredictor):
    name = "roofline_eff"
    description = "Roofline divided by one efficiency fitted over the training GPUs"

    def __init__(self, kind, seed: int = 0):
        super().__init__(kind, seed)
        self.efficiency = 1.0

    def fit(self, frame: pd.DataFrame, progress: bool = True) -> "RooflineEfficiency":
        # The scale s minimising mean |s * roof / meas - 1| is the weighted median of
        # meas / roof with weights roof / meas (MAPE is the metric).
        roof = roofline_ms(self.kind, frame)
        ratio = frame["latency_ms"].to_numpy(float) / roof
        order = np.argsort(ratio)
        w = np.cumsum(1.0 / ratio[order])
        scale = ratio[order][np.searchsorted(w, 0.5 * w[-1])]
        self.efficiency = float(1.0 / scale)
        return self

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        return roofline_ms(self.kind, frame) / self.efficiency

    def get_state(self) -> dict:
        return {"efficiency": self.efficiency}

    def set_state(self, state: dict) -> None:
        self.efficiency = float(state["efficiency"])


class XGBoostBaseline(KindPredictor):
    name = "xgboost"
    description = "XGBoost on log shapes and log datasheet figures, predicting log ms"

    def __init__(self, kind, seed: int = 0, rounds: int = 400, max_depth: int = 8):
        super().__init__(kind, seed)
        self.rounds, self.max_depth = rounds, max_depth
        self.booster = None

    def fit(self, frame: pd.DataFrame, progress: bool = True) -> "XGBoostBaseline":
        import xgboost as xgb
        x = learned_inputs(self.kind, frame)
        y = np.log(frame["latency_ms"].to_numpy(float))
        params = {"objective": "reg:squarederror", "eta": 0.1, "max_depth": self.max_depth,
                  "subsample": 0.8, "colsample_bytree": 0.8, "tree_method": "hist",
                  "nthread": XGB_THREADS, "seed": self.seed}
        self.booster = xgb.train(params, xgb.DMatrix(x, label=y), num_boost_round=self.rounds)
        return self

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        import xgboost as xgb
        return np.exp(self.booster.predict(xgb.DMatrix(learned_inputs(self.kind, frame))))

    def get_state(self) -> dict:
        raw = np.frombuffer(bytes(self.booster.save_raw("json")), np.uint8).copy()
        return {"rounds": self.rounds, "max_depth": self.max_depth, "booster": raw}

    def set_state(self, state: dict) -> None:
        import xgboost as xgb
        self.rounds, self.max_depth = int(state["rounds"]), int(state["max_depth"])
        self.booster = xgb.Booster(params={"nthread": XGB_THREADS})
        self.booster.load_model(bytearray(np.asarray(state["booster"]).tobytes()))


class MLPBaseline(KindPredictor):
    name = "mlp"
    description = "Unbounded MLP on log shapes and log datasheet figures, predicting log ms"

    def __init__(self, kind, seed: int = 0, hidden: int = 128, layers: int = 3,
                 epochs: int = 60, batch: int = 512, lr: float = 2e-3):
        super().__init__(kind, seed)
        self.hp = {"hidden": hidden, "layers": layers, "epochs": epochs, "batch": batch,
                   "lr": lr}
        self.weights: list[np.ndarray] = []
        self.mean = self.std = None

    def fit(self, frame: pd.DataFrame, progress: bool = True) -> "MLPBaseline":
        x = learned_inputs(self.kind, frame)
        self.mean, self.std = x.mean(0), np.maximum(x.std(0), MIN_STD)
        y = np.log(frame["latency_ms"].to_numpy(float))[:, None]
        self.weights = fit_mlp((x - self.mean) / self.std, y, Fit(seed=self.seed, **self.hp),
                               progress=progress, desc=f"mlp {self.kind.name}")
        return self

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        x = (learned_inputs(self.kind, frame) - self.mean) / self.std
        return np.exp(mlp_forward(self.weights, x)[:, 0])

    def get_state(self) -> dict:
        return {"hp": self.hp, "weights": self.weights, "mean": self.mean, "std": self.std}

    def set_state(self, state: dict) -> None:
        self.hp, self.weights = dict(state["hp"]), list(state["weights"])
        self.mean, self.std = np.asarray(state["mean"]), np.asarray(state["std"])
