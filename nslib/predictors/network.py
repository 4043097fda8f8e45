"""The small ReLU MLPs of the learned predictors: built in torch to train, run in numpy.

A trained network is kept as its ``[W0, b0, W1, b1, ...]`` float32 arrays
(:func:`mlp_weights`), so a cached predictor predicts without importing torch
(:func:`mlp_forward`).
"""
from __future__ import annotations

import numpy as np

# Raw outputs are clipped to +-these before a sigmoid (which then stays below 1 in float64)
# or an exp (a factor of at most e**20, ~5e8) turns them into an efficiency or a scale.
SIGMOID_CLIP = 30
EXP_CLIP = 20


def make_mlp(n_in: int, layers: int, hidden: int, n_out: int):
    """A torch MLP (for training): ``layers`` x (Linear(hidden), ReLU), then Linear(n_out)."""
    from torch import nn
    mods, d = [], n_in
    for _ in range(layers):
        mods += [nn.Linear(d, hidden), nn.ReLU()]
        d = hidden
    mods.append(nn.Linear(d, n_out))
    return nn.Sequential(*mods)


def mlp_weights(model) -> list[np.ndarray]:
    """A trained :func:`make_mlp`'s ``[W0, b0, W1, b1, ...]`` as float32 numpy arrays."""
    return [p.detach().cpu().numpy().copy() for p in model.parameters()]


def mlp_forward(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """The MLP of ``weights`` (:func:`mlp_weights`) on inputs ``x`` (n, d), in float64 numpy:
    ReLU between the linear layers, none after the last."""
    h = np.asarray(x, float)
    for i in range(0, len(weights), 2):
        h = h @ weights[i].T.astype(float) + weights[i + 1].astype(float)
        if i + 2 < len(weights):
            h = np.maximum(h, 0.0)
    return h
