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
    training seed (same seed, same weights, same tables); ``progress``: show progress bars.
    """
    data: str | os.PathLike | None = None
    quick: bool = False
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        object.__setattr__(self, "quick", bool(self.quick))
        object.__setattr__(self, "progress", bool(self.progress))
        object.__setattr__(self, "seed", check_int("seed", self.seed, minimum=0))

    def but(self, **changes) -> "Settings":
        """A copy with ``changes`` (e.g. ``settings.but(progress=False)`` for an inner loop)."""
        return replace(self, **changes)


DEFAULT = Settings()


def settings_of(settings: Settings | None) -> Settings:
    """``settings``, or the default run when None; a TypeError naming the fix otherwise."""
    if settings is None:
        return DEFAULT
    if not isinstance(settings, Settings):
        raise TypeError(f"settings must be an nslib Settings (nslib.Settings(data=..., "
                        f"quick=..., seed=...)), not {type(settings).__name__}")
    return settings
