"""The one way notebooks write figures and tables: PNG + PDF, CSV + Markdown, atomically."""
from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pandas as pd

from nslib.data.paths import atomic_write_bytes, atomic_write_text, figures_dir

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _check(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"figure/table name {name!r} must be letters, digits, '_', '-', '.'")
    return name


def save_figure(fig, name: str, out: str | os.PathLike | None = None, dpi: int = 120) -> list[Path]:
    """Save a matplotlib figure as ``<out>/<name>.png`` and ``.pdf`` (default out: figures/)."""
    folder = figures_dir(out)
    paths = []
    for ext in ("png", "pdf"):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, dpi=dpi, bbox_inches="tight",
                    **({"metadata": {"CreationDate": None}} if ext == "pdf" else {}))
        paths.append(atomic_write_bytes(folder / f"{_check(name)}.{ext}", buf.getvalue()))
    return paths


def save_table(df: pd.DataFrame, name: str, out: str | os.PathLike | None = None,
               digits: int = 1) -> list[Path]:
    """Save a table as ``<out>/<name>.csv`` (full precision) and ``.md`` (rounded)."""
    folder = figures_dir(out)
    csv = atomic_write_text(folder / f"{_check(name)}.csv", df.to_csv())
    md = atomic_write_text(folder / f"{name}.md", df.round(digits).to_markdown() + "\n")
    return [csv, md]
