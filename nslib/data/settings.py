"""The run's settings in one frozen object, made once at the edge (the CLI, a notebook's
parameters cell) and passed down, instead of ``data``, ``quick``, ``seed`` and ``progress``
threaded through every call by hand.

``Settings()`` is the default run: the NeuSight data where :func:`nslib.data.paths.data_root`
finds it, the full training profile, seed 0, progress bars on.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from nslib.data.checks import check_int


@dataclass(frozen=True)
class Settings:
    """How a run reads data and trains.

    ``data``: the NeuSight data folder (``None``: ``NSLIB_DATA``, then ``../shared/neusight``);
    ``quick``: the quick training profile (tests, ``--quick``); ``seed``: the predictors'
    training seed (same seed, same weights, same tables); ``progress``: show progress bars;
    ``mixed``: the 16-bit data folder (``None``: ``NSLIB_MIXED``, then ``../shared/mixed``).
    """
    data: str | os.PathLike | None = None
    quick: bool = False
    seed: int = 0
    progress: bool = True
    mixed: str | os.PathLike | None = None

    def __post_init__(self):
        object.__setattr__(self, "quick", bool(self.quick))
        object.__setattr__(self, "progress", bool(self.progress))
        object.__setattr__(self, "seed", check_int("seed", self.seed, minimum=0))

    def but(self, **changes) -> "Settings":
        """A copy with ``changes`` (e.g. ``settings.but(progress=False)`` for an inner loop)."""
        return replace(self, **changes)


DEFAULT = Settings()


def one_of(value, cls: type, default, make: str):
    """``value`` if it is a ``cls``, ``default`` when it is None (and a default exists); a
    TypeError saying how to make one (``make``) otherwise. The API's objects (settings, a step,
    its GPUs) are checked this one way."""
    if value is None and default is not None:
        return default
    if not isinstance(value, cls):
        raise TypeError(f"{cls.__name__.lower()} must be an nslib {cls.__name__} ({make}), not "
                        f"{type(value).__name__}")
    return value


def settings_of(settings: Settings | None) -> Settings:
    """``settings``, or the default run when None; a TypeError naming the fix otherwise."""
    return one_of(settings, Settings, DEFAULT, "Settings(data=..., quick=..., seed=...)")
