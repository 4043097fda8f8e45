"""Measured end-to-end latencies: ``label/<GPU>/<model>-<mode>-<seq>-<batch>[-variant].json``.

Each JSON holds ``e2e_latency``, ``fw_latency`` and ``bwall_latency`` in ms (mean of the 5
fastest of 25 runs). Variants: ``fusion`` (fused kernels), ``dp4``, ``tp4``, ``pp4_<m>``
(4-GPU data, tensor and pipeline parallel with m micro-batches).
"""
from __future__ import annotations

import json
import re

import pandas as pd

from nslib.data.checks import check_float
from nslib.data.paths import data_root, require

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


def _read_label(path) -> tuple[float, float, float]:
    """(e2e, fw, bw) in ms of one label file (fw/bw 0 when absent); ValueError naming the file
    (and the line, for broken JSON) otherwise."""
    hint = "expected e2e_latency, fw_latency, bwall_latency in ms; fix or restore the file"
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = f", line {e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
        raise ValueError(f"{path}{where}: not a NeuSight label ({e}); {hint}") from None
    if not isinstance(raw, dict) or "e2e_latency" not in raw:
        raise ValueError(f"{path}: not a NeuSight label (no e2e_latency); {hint}")
    out = []
    for k in ("e2e_latency", "fw_latency", "bwall_latency"):
        v = raw.get(k) or 0
        try:
            out.append(check_float(f"field {k!r}", v, minimum=0))
        except ValueError as e:
            raise ValueError(f"{path}: {e}; {hint}") from None
    if not out[0] > 0:
        raise ValueError(f"{path}: field 'e2e_latency' must be positive; {hint}")
    return tuple(out)


def load_labels(data=None) -> pd.DataFrame:
    """Every label in the data, one row each: gpu_key, tag, model, mode, seq, batch, variant,
    e2e_ms, fw_ms, bw_ms (fw/bw NaN where the measurement did not split them)."""
    root = require(data_root(data) / "label", "label folder")
    rows = []
    for path in sorted(root.glob("*/*.json")):
        e2e, fw, bw = _read_label(path)
        rows.append({"gpu_key": path.parent.name, "tag": path.stem, **parse_tag(path.stem),
                     "e2e_ms": e2e, "fw_ms": fw if fw > 0 else float("nan"),
                     "bw_ms": bw if bw > 0 else float("nan")})
    return pd.DataFrame(rows)
