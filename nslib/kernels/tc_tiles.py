"""Which CTA tile a tensor-core GEMM library would run, chosen the way its heuristic would.

The 16-bit GEMM tables carry no kernel names, so the tile of ``[m x k] @ [k x n]`` is chosen
here from a small CUTLASS/cuBLAS-like candidate set (:data:`CANDIDATES`: 64-256 rows and
columns, split-K 1-16) by an SM-clock cost model that knows only the GPU's SM count:

    cost = waves * (k / split) * (tm * tn / MACS + (tm + tn) / LOADS)   [SM clocks]
           + waves * CTA_FIXED + (split > 1) * m * n * split * 4 / LOADS_B

``waves = ceil(CTAs / num_sm)`` with ``CTAs = ceil(m / tm) * ceil(n / tn) * split``: a CTA's
main loop does ``tm * tn`` multiply-adds per k step on the tensor cores (``MACS`` per clock)
while loading ``tm + tn`` elements (``LOADS`` per clock), so big tiles reuse data better and
small tiles fill more SMs; split-K spreads a long reduction over idle SMs at the price of
writing fp32 partial tiles. The constants are GPU-free (an A100-like SM: 1024 BF16 MACs and
64 bytes of L2 loads per clock), so every GPU is treated alike and only its SM count moves the
choice; a caller may pass the GPU's own MACs per SM clock (datasheet BF16 rate over SMs and
clock: H100 ~1900, L40S ~500). Ties go to the earlier candidate (bigger tiles first).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

MACS = 1024.0        # BF16 multiply-adds per SM clock (tensor cores)
LOADS = 32.0         # 16-bit elements an SM loads per clock (64 bytes)
LOADS_B = 64.0       # bytes an SM moves per clock (split-K partials, fp32)
CTA_FIXED = 600.0    # clocks of a CTA's prologue and epilogue (launch, first loads, stores)
TILE_SIZES = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
SPLITS = (1, 2, 4, 8, 16)
# (tile_m, tile_n, split_k), bigger tiles first so that ties keep the bigger tile
CANDIDATES = tuple((tm, tn, s) for s in SPLITS for tm, tn in TILE_SIZES)


def _check(m, n, k, num_sm) -> None:
    for name, v in (("m", m), ("n", n), ("k", k), ("num_sm", num_sm)):
        if not np.all(np.isfinite(v)) or np.any(v <= 0):
            raise ValueError(f"GEMM tile choice needs positive finite {name}; got "
                             f"{np.asarray(v).ravel()[:3]}... (check the frame's {name} column)")


def candidate_costs(m, n, k, num_sm, macs=MACS) -> np.ndarray:
    """(rows, candidates) cost in SM clocks of each :data:`CANDIDATES` tile (module doc);
    ``macs``: BF16 multiply-adds per SM clock (scalar or per row)."""
    m, n, k, sm = (np.asarray(a, float)[:, None] for a in (m, n, k, num_sm))
    _check(m, n, k, sm)
    macs = np.broadcast_to(np.asarray(macs, float), m.shape[:1])[:, None]
    tm, tn, s = (np.array(c, float)[None, :] for c in zip(*CANDIDATES))
    ktile = np.ceil(k / s)
    ctas = np.ceil(m / tm) * np.ceil(n / tn) * s
    waves = np.ceil(ctas / sm)
    loop = ktile * (tm * tn / macs + (tm + tn) / LOADS)
    reduce = np.where(s > 1, m * n * s * 4.0 / LOADS_B, 0.0)  # fp32 partials written and read
    # a split longer than the reduction itself is never useful
    return np.where(s <= np.maximum(k / 64.0, 1.0), waves * (loop + CTA_FIXED) + reduce, np.inf)


def choose_tiles(m, n, k, num_sm, macs=MACS, rank: int = 0) -> pd.DataFrame:
    """The chosen tile of each GEMM: columns ``tile_m, tile_n, split`` (split-K factor),
    ``ctas`` (CTAs launched), ``waves`` (``ceil(ctas / num_sm)``) and ``fill``
    (``ctas / (waves * num_sm)``, in (0, 1]). ``rank``: the ``rank``-th cheapest candidate
    instead (0: the cheapest; a GEMM with fewer usable candidates keeps its cheapest)."""
    cost = candidate_costs(m, n, k, num_sm, macs)
    order = np.argsort(cost, axis=1, kind="stable")  # stable: ties keep the bigger tile
    pick = order[:, min(rank, cost.shape[1] - 1)]
    rows = np.arange(len(cost))
    pick = np.where(np.isfinite(cost[rows, pick]), pick, order[:, 0])
    best = np.array(CANDIDATES, float)[pick]
    m, n, sm = (np.asarray(a, float) for a in (m, n, num_sm))
    ctas = np.ceil(m / best[:, 0]) * np.ceil(n / best[:, 1]) * best[:, 2]
    waves = np.ceil(ctas / sm)
    return pd.DataFrame({"tile_m": best[:, 0], "tile_n": best[:, 1], "split": best[:, 2],
                         "ctas": ctas, "waves": waves, "fill": ctas / (waves * sm)})
