"""Standardising the inputs of a learned model: one column mean and spread, one clip range.

A model's inputs are ``(x - mean) / std`` per column; a constant column (``std`` 0 in the
training rows) keeps ``std = 1``, so it standardises to 0 instead of dividing by zero. A
model that clips its inputs to the training range (``lo``, ``hi`` of the standardised
training rows) saturates at the edge of what it learned instead of extrapolating.
"""
from __future__ import annotations

import numpy as np


def mean_std(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column means and standard deviations of ``x`` (n, d); a zero deviation becomes 1."""
    mean, std = x.mean(axis=0), x.std(axis=0)
    return mean, np.where(std > 0, std, 1.0)


def fit_scaling(x: np.ndarray, clip: bool = True) -> tuple[np.ndarray, ...]:
    """``(mean, std, lo, hi)`` of the training inputs ``x`` (n, d): :func:`mean_std`, and the
    range of the standardised rows (``clip``) or no range (-inf, inf)."""
    mean, std = mean_std(x)
    z = (x - mean) / std
    if clip:
        return mean, std, z.min(axis=0), z.max(axis=0)
    return mean, std, np.full(len(mean), -np.inf), np.full(len(mean), np.inf)


def standardise(x: np.ndarray, scaling: tuple[np.ndarray, ...]) -> np.ndarray:
    """``x`` (n, d) standardised by :func:`fit_scaling`'s ``(mean, std, lo, hi)`` and clipped
    to ``[lo, hi]`` (float64)."""
    mean, std, lo, hi = scaling
    return np.clip((x - mean) / std, lo, hi)
