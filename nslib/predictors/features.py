"""NeuSight's kernel inputs: the log2 tile features of a kernel on a GPU, and softmax row packing.

A featured kernel frame (:func:`nslib.kernels.sizes.add_features`, tiles from
:mod:`nslib.kernels.tiles`) gives each kernel its tile (FLOPs, bytes, rows x columns), the
blocks it launches and the waves they take; :func:`tile_features` turns those and the GPU's
datasheet into the MLP's inputs.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.data.units import KIB, KILO, MIB, MS_PER_S

FEATURES = ("compute", "load", "dram_footprint", "l2_footprint")  # the paper's four
PAPER_L2_FACTOR = 1024  # the paper's L2 footprint divides by L2 MB times 1024


def tile_features(frame: pd.DataFrame, features=FEATURES) -> np.ndarray:
    """The (n, len(features)) log2 per-SM-normalised features of method.md section 4.

    ``compute``: tile FLOPs / (peak TFLOP/s per SM); ``load``: tile MB / (GB/s per SM);
    ``dram_footprint``: waves * tile MB / (memory MB per SM); ``l2_footprint``:
    waves * tile MB / (L2 MB per SM, times 1024 as in the paper). Extras: ``waves``,
    ``tile_m``, ``tile_k``, ``aspect`` (tm / tk), ``reduction`` (N per split-K slice) for GEMMs, ``balance``
    (tile FLOP/byte over the GPU's peak FLOP/s per byte/s), ``num_sm``, ``fill``
    (blocks / (waves * num_sm), in (0, 1]); GPU-independent ``tile_kb`` (KiB a block
    moves), ``blocks`` and ``row`` (H of vector ops). float64.
    """
    def col(name: str) -> np.ndarray:
        return frame[name].to_numpy(float)

    sm, waves = col("num_sm"), col("waves")
    tile_mb = col("tile_bytes") / MIB
    cols = {
        "compute": lambda: col("tile_flops") / (col("peak_gflops") / KILO / sm),
        "load": lambda: tile_mb / (col("mem_bw") / sm),
        "dram_footprint": lambda: waves * tile_mb / (col("mem_gb") * KIB / sm),
        "l2_footprint": lambda: waves * tile_mb / (col("l2_mb") * PAPER_L2_FACTOR / sm),
        "waves": lambda: waves,
        # GPU-independent tile shape (GEMMs; NaN-free only where the class has the dims)
        "tile_m": lambda: col("tile_m"),
        "tile_k": lambda: col("tile_k"),
        # tile rows over columns (GEMMs only: NaN for other classes)
        "aspect": lambda: col("tile_m") / col("tile_k"),
        "reduction": lambda: col("N") / (col("split") if "split" in frame else 1.0),
        # tile arithmetic intensity over the machine balance (peak / bandwidth): > 1 compute-bound
        "balance": lambda: (col("tile_flops") / col("tile_bytes"))
        / (col("peak_gflops") / col("mem_bw")),
        "num_sm": lambda: sm,
        # GPU-independent kernel descriptors: bytes a block moves, blocks launched, row length
        "tile_kb": lambda: col("tile_bytes") / KIB,
        "blocks": lambda: col("blocks"),
        "row": lambda: col("H"),
        # how full the waves are on average: blocks / (waves * num_sm), in (0, 1]
        "fill": lambda: col("blocks") / (waves * sm),
    }
    unknown = set(features) - set(cols)
    if unknown:
        raise ValueError(f"unknown NeuSight feature(s) {sorted(unknown)}; known: {sorted(cols)}")
    return np.log2(np.column_stack([cols[f]() for f in features]))


def roofline_wave_ms(frame: pd.DataFrame) -> np.ndarray:
    """Time of one full wave at the roofline, ms: ``num_sm * tile_FLOPs / roofline``."""
    return frame["num_sm"].to_numpy(float) * frame["tile_flops"].to_numpy(float) / \
        frame["roofline_tput"].to_numpy(float) * MS_PER_S


class RowPacking:
    """Rows per thread block of softmax kernels, learned from the launch grids of training kernels.

    PyTorch's ``softmax_warp_forward`` (rows up to 1024 elements) packs several rows into one
    block (4 rows of more than 128 elements, more for shorter rows), while
    ``cunn_SoftMaxForward`` runs one row per block. Which one runs depends on the row length H
    only, so an unprofiled GPU takes the rows per block of the training row length nearest in
    log2 H. ``apply`` turns the one-row tiles of :func:`nslib.kernels.sizes.add_features` into packed
    tiles: tile FLOPs and bytes times the rows per block, blocks ``ceil(B / rows)``.
    """

    CLASSES = ("softmax",)

    def __init__(self, log2_h=None, rows=None):
        self.log2_h = np.asarray([] if log2_h is None else log2_h, float)
        self.rows = np.asarray([] if rows is None else rows, float)

    def fit(self, frame: pd.DataFrame) -> "RowPacking":
        sub = frame[frame["cls"].isin(self.CLASSES)]
        grid = (sub["grid_x"] * sub["grid_y"] * sub["grid_z"]).to_numpy(float) if len(sub) else []
        ok = np.isfinite(grid) & (np.asarray(grid) > 0) if len(sub) else []
        if len(sub) and np.any(ok):
            rows = np.ceil(sub["B"].to_numpy(float)[ok] / np.asarray(grid)[ok])
            tab = pd.Series(rows).groupby(np.log2(sub["H"].to_numpy(float)[ok])).median()
            self.log2_h, self.rows = tab.index.to_numpy(float), 2.0 ** np.round(np.log2(tab.to_numpy()))
        return self

    def rows_per_block(self, H: np.ndarray) -> np.ndarray:
        """Rows per block for row lengths ``H`` (nearest training H in log2; 1 if none)."""
        if not len(self.log2_h):
            return np.ones(len(H))
        x = np.log2(np.asarray(H, float))
        i = np.clip(np.searchsorted(self.log2_h, x), 1, len(self.log2_h) - 1) \
            if len(self.log2_h) > 1 else np.zeros(len(x), int)
        if len(self.log2_h) > 1:
            i = np.where(np.abs(self.log2_h[i - 1] - x) <= np.abs(self.log2_h[i] - x), i - 1, i)
        return self.rows[i]

    def apply(self, frame: pd.DataFrame) -> pd.DataFrame:
        """A copy of a featured frame with packed softmax tiles (other rows unchanged)."""
        mask = frame["cls"].isin(self.CLASSES).to_numpy()
        if not mask.any() or not len(self.log2_h):
            return frame
        out = frame.copy()
        sub = out.loc[mask]
        r = self.rows_per_block(sub["H"].to_numpy(float))
        blocks = np.ceil(sub["B"].to_numpy(float) / r)
        out.loc[mask, "tile"] = sub["H"].to_numpy(float) * r
        out.loc[mask, "tile_flops"] = sub["tile_flops"].to_numpy(float) * r
        out.loc[mask, "tile_bytes"] = sub["tile_bytes"].to_numpy(float) * r
        out.loc[mask, "blocks"] = blocks
        out.loc[mask, "waves"] = np.ceil(blocks / sub["num_sm"].to_numpy(float))
        return out

    def get_state(self) -> dict:
        return {"log2_h": self.log2_h, "rows": self.rows}

    @classmethod
    def from_state(cls, state: dict | None) -> "RowPacking":
        if not state:
            return cls()
        return cls(np.asarray(state["log2_h"], float), np.asarray(state["rows"], float))
