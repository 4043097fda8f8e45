"""Where a notebook run by hand writes: ``figures/interactive/`` (git-ignored).

``make reproduce`` (and the tests) pass every notebook its ``out`` folder; a person who opens a
notebook and runs it leaves ``out = None``, and exploring (another GPU, another model in the
explorer) must not rewrite the tracked figures of the last full reproduction.
"""
from __future__ import annotations

import os
from pathlib import Path

from nslib.data.paths import figures_dir

__all__ = ["INTERACTIVE", "notebook_out"]

INTERACTIVE = "interactive"   # subfolder of figures/, listed in .gitignore


def notebook_out(out: str | os.PathLike | None = None) -> Path:
    """``out`` as given, else ``figures/interactive/``; created either way."""
    return figures_dir(out if out is not None else figures_dir() / INTERACTIVE)
