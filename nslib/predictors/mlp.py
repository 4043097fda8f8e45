"""The unbounded MLP ablation: NeuSight's features and network, a plain latency output.

No roofline bound and no waves: the MLP's output is ``log(latency in ms)``. On GPUs faster than
any seen in training nothing stops it from predicting the old GPUs' speeds.
"""
from __future__ import annotations

from nslib.predictors.neusight import NeuSight


class UnboundedMLP(NeuSight):
    name = "mlp"
    description = "Unbounded MLP on NeuSight's tile features, predicting log latency directly"
    bounded = False
