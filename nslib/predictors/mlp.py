"""The unbounded MLP ablation: the paper's four tile features and nslib's network, a plain
latency output.

No roofline bound and no waves: the MLP's output is ``log(latency in ms)``. On GPUs faster than
any seen in training nothing stops it from predicting the old GPUs' speeds.
"""
from __future__ import annotations

from nslib.kernels import sizes
from nslib.predictors.features import FEATURES
from nslib.predictors.nslib_design import NslibDesign


class UnboundedMLP(NslibDesign):
    name = "mlp"
    description = "Unbounded MLP on NeuSight's tile features, predicting log latency directly"
    bounded = False

    @classmethod
    def class_defaults(cls) -> dict:
        """Whole-kernel latency needs the size-dependent footprints: the paper's four features."""
        return {c: {"features": FEATURES} for c in sizes.CLASSES}
