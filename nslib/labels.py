"""Measured end-to-end latencies: ``label/<GPU>/<model>-<mode>-<seq>-<batch>[-variant].json``.

Each JSON holds ``e2e_latency``, ``fw_latency`` and ``bwall_latency`` in ms (mean of the 5
fastest of 25 runs). Variants: ``fusion`` (fused kernels), ``dp4``, ``tp4``, ``pp4_<m>``
(4-GPU data, tensor and pipeline parallel with m micro-batches).
"""
from __future__ import annotations

import json
import re

import pandas as pd

from .paths import data_root, require

_TAG = re.compile(r"^(?P<model>.+?)-(?P<mode>inf|train)-(?P<seq>\d+)-(?P<batch>\d+)"
                  r"(?:-(?P<variant>[A-Za-z0-9_]+))?$")


def parse_tag(tag: str) -> dict:
    """``bert_large-inf-512-8-fusion`` -> {model, mode, seq, batch, variant}."""
    m = _TAG.match(tag)
    if not m:
        raise ValueError(f"label name {tag!r} is not <model>-<inf|train>-<seq>-<batch>[-variant]")
    d = m.groupdict()
    return {"model": d["model"], "mode": d["mode"], "seq": int(d["seq"]),
            "batch": int(d["batch"]), "variant": d["variant"] or ""}


def load_labels(data=None) -> pd.DataFrame:
    """Every label in the data, one row each: gpu_key, tag, model, mode, seq, batch, variant,
    e2e_ms, fw_ms, bw_ms (fw/bw NaN where the measurement did not split them)."""
    root = require(data_root(data) / "label", "label folder")
    rows = []
    for path in sorted(root.glob("*/*.json")):
        try:
            raw = json.loads(path.read_text())
            e2e = float(raw["e2e_latency"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: not a NeuSight label ({e}); expected e2e_latency, "
                             "fw_latency, bwall_latency in ms") from None
        fw, bw = float(raw.get("fw_latency") or 0), float(raw.get("bwall_latency") or 0)
        rows.append({"gpu_key": path.parent.name, "tag": path.stem, **parse_tag(path.stem),
                     "e2e_ms": e2e, "fw_ms": fw if fw > 0 else float("nan"),
                     "bw_ms": bw if bw > 0 else float("nan")})
    return pd.DataFrame(rows)
