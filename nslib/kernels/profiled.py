"""Datasheets checked against the profiler: the SM count a measured GPU's kernels ran on.

NeuSight's kernel files (and ``nslib collect``'s) record each kernel's launch grid and the
profiler's ``Blocks per SM``: the grid's blocks over the SMs the driver reported. Their ratio is
the GPU's SM count as the measurements saw it. A datasheet whose ``Num_Sm`` disagrees prices
that GPU's waves on another SM count than its measurements ran on, so :func:`sm_mismatches`
names it. It is a check of the data, not a correction: nothing here changes a datasheet.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.data.cache import JSON, cached
from nslib.data.gpus import find_gpu, load_gpus
from nslib.data.paths import data_root, hash_files

COLUMNS = ["Device", "Blocks per SM", "Grid x", "Grid y", "Grid z"]
TOLERANCE = 0.02   # the profiler rounds blocks per SM (to 2-3 digits)


def kernel_files(data=None) -> list:
    """Every kernel CSV of the data: the training collection and the test tables (sorted)."""
    root = data_root(data) / "data" / "dataset"
    return sorted([*root.glob("train/collect/*/*/*.csv"), *root.glob("test/*.csv")])


def profiled_sms(files) -> dict[str, float]:
    """Per ``Device``, the median over its kernels of launch blocks over ``Blocks per SM``
    (kernels that record it); files without those columns add nothing. Cached by the files'
    content."""
    files = list(files)
    key = hash_files(files, extra=["profiled-sms-1"])
    return cached("tables", f"sms-{key}", lambda: _read(files), "profiled SM counts", JSON,
                  valid=lambda v: isinstance(v, dict))


def _read(files) -> dict[str, float]:
    parts = []
    for f in files:
        try:
            parts.append(pd.read_csv(f, usecols=COLUMNS))
        except (ValueError, pd.errors.ParserError):
            continue   # not a profiled kernel file; the tables' own reader names bad files
    if not parts:
        return {}
    d = pd.concat(parts, ignore_index=True)
    per_sm = pd.to_numeric(d["Blocks per SM"], errors="coerce")
    grid = d[["Grid x", "Grid y", "Grid z"]].apply(pd.to_numeric, errors="coerce").prod(axis=1)
    ok = (per_sm > 0) & (grid > 0)
    sms = (grid[ok] / per_sm[ok]).groupby(d.loc[ok, "Device"]).median()
    return {str(g): float(v) for g, v in sms.items() if np.isfinite(v)}


def sm_mismatches(data=None) -> list[str]:
    """One line per measured GPU whose datasheet ``Num_Sm`` differs from the SM count its
    kernels ran on (:func:`profiled_sms`) by more than :data:`TOLERANCE`."""
    gpus, out = load_gpus(data), []
    for name, sms in sorted(profiled_sms(kernel_files(data)).items()):
        try:
            sheet = find_gpu(name, gpus)
        except KeyError:
            continue   # the kernel tables name a measured GPU without a datasheet
        if abs(sheet.num_sm / sms - 1.0) > TOLERANCE:
            out.append(f"{name}: its measured kernels ran on {sms:.0f} SMs (launch blocks / "
                       f"the profiler's blocks per SM), its datasheet says Num_Sm "
                       f"{sheet.num_sm} ({sheet.key}.json): the datasheet prices its waves "
                       "on another SM count than it has")
    return out
