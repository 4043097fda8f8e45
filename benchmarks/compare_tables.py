"""Compare the tables of two reproductions: every CSV in one figures folder against the other's.

    python benchmarks/compare_tables.py BEFORE/figures AFTER/figures

Prints one line per table: ``same`` (byte for byte), ``equal values`` (same cells once read,
e.g. a float written with other digits), or what differs (shape, columns, the largest
difference per numeric column). Exits 1 if any table differs or is missing on one side, so a
refactoring that must not change a number can be checked by its exit status.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd


def compare_csv(a: Path, b: Path) -> str | None:
    """None when the two CSVs hold the same table; else a short description of the difference."""
    if a.read_bytes() == b.read_bytes():
        return None
    x, y = pd.read_csv(a), pd.read_csv(b)
    if x.shape != y.shape or list(x.columns) != list(y.columns):
        return f"shape {x.shape} vs {y.shape}, columns differ: " \
               f"{sorted(set(x.columns) ^ set(y.columns)) or 'order'}"
    diffs = []
    for c in x.columns:
        u, v = x[c], y[c]
        if pd.api.types.is_numeric_dtype(u) and pd.api.types.is_numeric_dtype(v):
            gap = np.nanmax(np.abs(u.to_numpy(float) - v.to_numpy(float)), initial=0.0)
            same_nan = np.array_equal(u.isna().to_numpy(), v.isna().to_numpy())
            if gap > 0 or not same_nan:
                diffs.append(f"{c}: max |diff| {gap:.3g}" + ("" if same_nan else ", NaNs differ"))
        elif not u.astype(str).equals(v.astype(str)):
            diffs.append(f"{c}: {int((u.astype(str) != v.astype(str)).sum())} cells differ")
    return "; ".join(diffs) if diffs else "equal values"


def compare_folders(before: Path, after: Path) -> dict[str, str]:
    """``{table file name: 'same' | 'equal values' | difference}`` over both folders' CSVs."""
    names = sorted({p.name for p in before.glob("*.csv")} | {p.name for p in after.glob("*.csv")})
    out = {}
    for n in names:
        a, b = before / n, after / n
        if not a.exists() or not b.exists():
            out[n] = f"missing in {'before' if not a.exists() else 'after'}"
        else:
            out[n] = compare_csv(a, b) or "same"
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    result = compare_folders(Path(argv[0]), Path(argv[1]))
    for name, what in result.items():
        print(f"{name}: {what}")
    bad = [n for n, w in result.items() if w not in ("same", "equal values")]
    print(f"{len(result)} tables, {len(bad)} differ" + (f": {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
