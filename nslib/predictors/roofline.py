"""Roofline baseline: ``max(FLOPs / peak, bytes / bandwidth)``, nothing learned."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import kernels
from .base import Predictor


class Roofline(Predictor):
    name = "roofline"
    description = "max(FLOPs / FP32 peak, bytes / memory bandwidth); no training"

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        return kernels.roofline_ms(frame)
