"""Roofline baseline: ``max(FLOPs / peak, bytes / bandwidth)``, nothing learned."""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.kernels import sizes
from nslib.predictors.base import Predictor


class Roofline(Predictor):
    name = "roofline"
    description = "max(FLOPs / FP32 peak, bytes / memory bandwidth); no training"

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        return sizes.roofline_ms(frame)
