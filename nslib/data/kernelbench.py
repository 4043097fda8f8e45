"""KernelBench's public eager timings: campaigns, their timing files and their datasheets.

Setting: ``NSLIB_KERNELBENCH`` (or ``--kernelbench``), default ``datasets/kernelbench``: a
folder with ``device_configs/*.json`` (NeuSight-format datasheets, ``Device`` = the name PyTorch
reports) and one folder per campaign holding ``baseline_time_torch.json`` (KernelBench's file:
``{"level1": {"<N>_<Name>.py": {"mean", "std", "min", "max", "hardware", ...}}, ...}``, ms)
and the problem files ``level1/*.py`` as they were when timed. A campaign folder dropped in
later is read like the others.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pandas as pd

from nslib.data.gpus import GPU, load_gpu_file
from nslib.data.paths import PROJECT_ROOT, datasheet_folder

DEFAULT_KERNELBENCH = PROJECT_ROOT / "datasets" / "kernelbench"
TIMING_FILE = "baseline_time_torch.json"
LEVELS = (1, 2, 3)


def kernelbench_root(root: str | os.PathLike | None = None) -> Path:
    """The KernelBench folder (``root``, else ``NSLIB_KERNELBENCH``, else the default);
    :class:`DataNotFoundError` saying how to get it when it has no ``device_configs/``."""
    return datasheet_folder(root, "NSLIB_KERNELBENCH", DEFAULT_KERNELBENCH,
                            "KernelBench timings", "kernelbench")


def campaigns(root: str | os.PathLike | None = None) -> list[str]:
    """The campaign folders (those holding a timing file), sorted."""
    base = kernelbench_root(root)
    return sorted(p.parent.name for p in base.glob(f"*/{TIMING_FILE}"))


def datasheets(root: str | os.PathLike | None = None) -> dict[str, GPU]:
    """The datasheets of ``device_configs/``, keyed by their ``Device`` name."""
    base = kernelbench_root(root)
    return {g.name: g for g in (load_gpu_file(p) for p in sorted((base / "device_configs")
                                                                  .glob("*.json")))}


def _number(problem: str) -> int:
    m = re.match(r"(\d+)_", problem)
    return int(m.group(1)) if m else -1


def _ms(v) -> float:
    """A timing statistic (ms), NaN when absent or not a number."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")


def timings(root: str | os.PathLike | None = None, level: int = 1) -> pd.DataFrame:
    """One row per timed problem of ``level`` in every campaign: ``campaign``, ``problem`` (file
    name), ``number``, ``path`` (the problem file, None when the campaign lacks it),
    ``hardware`` (the GPU's ``Device`` name), ``latency_ms`` (mean of the trials), ``std_ms``,
    ``min_ms``; problems a campaign did not time (``null``) are left out. ValueError naming
    the file for a malformed timing file."""
    if level not in LEVELS:
        raise ValueError(f"KernelBench level must be one of {LEVELS}, got {level!r}")
    base = kernelbench_root(root)
    rows = []
    for camp in campaigns(base):
        path = base / camp / TIMING_FILE
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not a KernelBench timing file ({e}); fix or remove "
                             "the campaign folder") from None
        entries = raw.get(f"level{level}", {}) if isinstance(raw, dict) else None
        if not isinstance(entries, dict):
            raise ValueError(f"{path}: 'level{level}' must map problem files to timings")
        for problem, t in sorted(entries.items(), key=lambda kv: _number(kv[0])):
            if t is None:
                continue  # a problem the campaign did not time
            mean = t.get("mean") if isinstance(t, dict) else None
            if not isinstance(mean, (int, float)) or isinstance(mean, bool) \
                    or not math.isfinite(mean) or mean <= 0 \
                    or not isinstance(t.get("hardware"), str):
                raise ValueError(f"{path}: level{level} entry {problem!r} needs a positive "
                                 "'mean' (ms) and a 'hardware' name")
            if not re.fullmatch(r"[\w.\-]+\.py", problem):
                raise ValueError(f"{path}: level{level} entry {problem!r} is not a problem "
                                 "file name (NAME.py, no folders)")
            file = base / camp / f"level{level}" / problem
            rows.append({"campaign": camp, "problem": problem, "number": _number(problem),
                         "path": str(file) if file.is_file() else None,
                         "hardware": t["hardware"].strip(), "latency_ms": float(t["mean"]),
                         "std_ms": _ms(t.get("std")), "min_ms": _ms(t.get("min"))})
    cols = ["campaign", "problem", "number", "path", "hardware", "latency_ms", "std_ms", "min_ms"]
    return pd.DataFrame(rows, columns=cols)
