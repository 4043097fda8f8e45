"""GPU-to-GPU links: what a transfer between two GPUs of one server costs.

**Link model** (:class:`LinkSpec`). A GPU's datasheet link bandwidth (NVLink: the total of both
directions, e.g. 900 GB/s for H100 SXM, 600 GB/s for A100 SXM) times the paper's utilisation
:data:`LINK_UTILISATION` (0.72), halved (one direction of a full-duplex link), is the bandwidth
a transfer sees: ``effective = bandwidth * 0.72 / 2``. A ring all-reduce of ``b`` bytes over
``n`` GPUs sends ``2*(n-1)/n * b`` bytes per GPU in ``2*(n-1)`` steps: ``2*(n-1)/n * b /
effective + 2*(n-1) * latency``; a point-to-point send ``b / effective + latency``. The per-hop
latency :data:`LINK_LATENCY_US` is a nominal 1 us (an order of magnitude for NVLink), not
fitted; it matters only for tiny messages. Where the bandwidth comes from
(:func:`default_link`): the ``Link_Bw`` figure (GB/s, both directions) of the GPU's datasheet
(also ``Link_Util`` and ``Link_Latency_us`` when its JSON gives them), never the GPU's name;
a datasheet without it gets :data:`FALLBACK_LINK_GBPS` (PCIe 3.0 x16, the slowest link of a
GPU server), and the report says so. ``link=`` / ``--link-bw`` override it.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from nslib.data.paths import data_root
from nslib.data.units import GIGA, MS_PER_S, MS_PER_US

__all__ = ["LINK_UTILISATION", "LINK_LATENCY_US", "LINK_DIRECTIONS", "FALLBACK_LINK_GBPS",
           "LinkSpec", "raw_spec", "default_link", "resolve_link"]

# Fraction of the datasheet bandwidth a collective achieves: the NeuSight paper's link
# utilisation for multi-GPU communication (method.md 6).
LINK_UTILISATION = 0.72
# Per-hop latency, us: a nominal order of magnitude for NVLink, not fitted (tiny messages only).
LINK_LATENCY_US = 1.0
# Datasheet link figures count both directions of a full-duplex link; a transfer sees one.
LINK_DIRECTIONS = 2.0


@dataclass(frozen=True)
class LinkSpec:
    """A GPU-to-GPU link: datasheet bandwidth (GB/s, both directions), utilisation, latency."""

    bandwidth_gbps: float
    utilisation: float = LINK_UTILISATION
    latency_us: float = LINK_LATENCY_US
    halved: bool = True     # datasheet figure counts both directions: one direction is half
    source: str = ""        # where the bandwidth came from (for reports)

    def __post_init__(self):
        for name in ("bandwidth_gbps", "utilisation"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"LinkSpec.{name} must be a positive number, got {v!r}")
        if not (isinstance(self.latency_us, (int, float)) and self.latency_us >= 0):
            raise ValueError(f"LinkSpec.latency_us must be >= 0, got {self.latency_us!r}")

    @property
    def effective_gbps(self) -> float:
        """What one transfer sees: bandwidth * utilisation (/ 2 when halved), GB/s."""
        return self.bandwidth_gbps * self.utilisation / (LINK_DIRECTIONS if self.halved else 1.0)

    def allreduce_ms(self, nbytes, n: int):
        """Ring all-reduce of ``nbytes`` over ``n`` GPUs, ms (0 for n = 1)."""
        nbytes = np.asarray(nbytes, float)
        if n <= 1:
            return nbytes * 0.0
        steps = 2 * (n - 1)
        return (steps / n) * nbytes / (self.effective_gbps * GIGA) * MS_PER_S + \
            steps * self.latency_us * MS_PER_US

    def p2p_ms(self, nbytes):
        """A point-to-point send of ``nbytes``, ms."""
        nbytes = np.asarray(nbytes, float)
        return nbytes / (self.effective_gbps * GIGA) * MS_PER_S + \
            self.latency_us * MS_PER_US

    def to_dict(self) -> dict:
        return {**asdict(self), "effective_gbps": self.effective_gbps}


# A datasheet without Link_Bw: PCIe 3.0 x16 (16 GB/s each way), the slowest GPU link in use.
FALLBACK_LINK_GBPS = 32.0


def raw_spec(gpu, spec_path=None, data=None) -> dict:
    """The raw device JSON of a GPU (for optional keys the GPU dataclass does not carry)."""
    paths = []
    if spec_path is not None:
        paths.append(Path(spec_path))
    key = getattr(gpu, "key", "")
    if key:
        try:
            paths.append(data_root(data) / "data" / "device_configs" / f"{key}.json")
        except Exception:  # noqa: BLE001 - no data folder: no optional keys
            pass
    for p in paths:
        try:
            raw = json.loads(Path(p).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict):
            return raw
    return {}


def default_link(gpu, data=None, spec_path=None) -> LinkSpec:
    """The link of a GPU: its datasheet's ``Link_Bw`` (and ``Link_Util``, ``Link_Latency_us``
    from its JSON), else :data:`FALLBACK_LINK_GBPS` (see the module docstring)."""
    raw = raw_spec(gpu, spec_path, data)
    name = getattr(gpu, "name", str(gpu))
    util = raw.get("Link_Util", LINK_UTILISATION)
    lat = raw.get("Link_Latency_us", LINK_LATENCY_US)
    bw = raw.get("Link_Bw", getattr(gpu, "link_gbps", None))
    if bw is not None:
        if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not 0 < bw < math.inf:
            raise ValueError(f"{name}: device JSON field 'Link_Bw' (GPU-to-GPU link bandwidth, "
                             f"GB/s both directions) must be a positive number, got {bw!r}")
        return LinkSpec(float(bw), float(util), float(lat), source="datasheet Link_Bw")
    return LinkSpec(FALLBACK_LINK_GBPS, float(util), float(lat),
                    source="no Link_Bw in the datasheet: PCIe 3.0 x16 assumed (add Link_Bw, "
                           "GB/s both directions, or pass --link-bw)")


def resolve_link(link, gpu, data=None, spec_path=None) -> LinkSpec:
    """``link`` as a LinkSpec: None -> :func:`default_link`; a number -> that datasheet
    bandwidth (GB/s) with the default utilisation, halving and latency; a LinkSpec as is;
    a dict -> LinkSpec fields."""
    if link is None:
        return default_link(gpu, data, spec_path)
    if isinstance(link, LinkSpec):
        return link
    if isinstance(link, dict):
        return LinkSpec(**link)
    if isinstance(link, (int, float)) and not isinstance(link, bool):
        base = default_link(gpu, data, spec_path)
        return replace(base, bandwidth_gbps=float(link), source="override")
    raise TypeError(f"link must be None, a bandwidth in GB/s, a dict or a LinkSpec, "
                    f"not {type(link).__name__}")
