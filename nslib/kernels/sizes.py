"""Kernel classes and their derived sizes: FLOPs, bytes, tiles, blocks, waves, roofline.

Everything here is a pure, vectorized function over a pandas frame of kernels, one row each.
The frame's columns (see :data:`DIM_COLS`, :data:`GPU_COLS`):

- ``cls``: kernel class, one of :data:`CLASSES`; ``op``: the measured op name (``bmm``,
  ``linear``, ``add``, ``addu``, ..., ``softmax``, ``ln``).
- dims (float64, NaN where a class has no such dim): ``B, M, N, K`` for GEMMs (B batched
  products of an M x N matrix by an N x K one; N is the reduction length) and ``B, H`` for
  vector ops (B rows of H elements).
- GPU datasheet: ``num_sm``, ``peak_gflops`` (FP32, GFLOP/s), ``mem_bw`` (GB/s),
  ``mem_gb`` (GB), ``l2_mb`` (MB).

Units: FLOPs in FLOP, bytes in bytes, throughputs in FLOP/s, latencies in ms.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

CLASSES = ("bmm", "linear", "elementwise", "softmax", "layernorm")
GEMM_CLASSES = ("bmm", "linear")
VECTOR_CLASSES = ("elementwise", "softmax", "layernorm")
# A model's kernels in the order its per-class tables and plots list them: the paper's FC, BMM,
# EW, softmax, LN, then memory ops (copies, gathers), which the trace adds to CLASSES
MODEL_CLASSES = ("linear", "bmm", "elementwise", "softmax", "layernorm", "memory")
DIM_COLS = ("B", "M", "N", "K", "H")
GPU_COLS = ("num_sm", "peak_gflops", "mem_bw", "mem_gb", "l2_mb")
BYTES_PER_ELEM = 4  # FP32: the NeuSight measurements (16-bit traces: see elem_bytes)

# op -> (class, number of tensor inputs, FLOPs per output element)
OPS = {
    "bmm": ("bmm", 2, None),
    "linear": ("linear", 2, None),
    **{op: ("elementwise", 2, 1) for op in ("add", "mul", "div", "pow")},
    **{op: ("elementwise", 1, 1) for op in ("addu", "mulu", "divu", "powu", "tanh", "relu", "gelu")},
    "softmax": ("softmax", 1, 5),
    "ln": ("layernorm", 1, 6),
    # backward kernels of the traced models (never measured alone): the gradient is one more
    # input, so they move 1.5x the forward's bytes
    # softmax: the row kernel after CUDA's grad * output kernel (row sum, times the output,
    # subtract); log-softmax: grad - exp(output) * row sum of grad, one kernel
    "softmax_bw": ("softmax", 2, 3),
    "logsoftmax_bw": ("softmax", 2, 4),
    "ln_bw": ("layernorm", 2, 8),
    "ln_wgrad": ("layernorm", 1, 2),  # weight/bias grads: reads two B x H tensors
}
# backward op -> its measured forward
FORWARD_OP = {"softmax_bw": "softmax", "logsoftmax_bw": "softmax", "ln_bw": "ln",
              "ln_wgrad": "ln"}


def bytes_ratio_to_forward(op: str) -> float:
    """Bytes a vector op moves per output over its forward op's (1 for measured ops)."""
    fwd = FORWARD_OP.get(op, op)
    return (OPS[op][1] + 1) / (OPS[fwd][1] + 1)


def op_class(ops: pd.Series) -> pd.Series:
    """The kernel class of each op name; unknown op names raise a ValueError listing them."""
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        raise ValueError(f"unknown op name(s) {unknown}; known: {sorted(OPS)}")
    return ops.map({k: v[0] for k, v in OPS.items()})


def _per_output(ops: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs per output, bytes per output) for vector ops; NaN for GEMMs."""
    n_in = ops.map({k: v[1] for k, v in OPS.items()}).to_numpy(float)
    ops_per_o = ops.map({k: v[2] for k, v in OPS.items()}).to_numpy(float)
    return ops_per_o, BYTES_PER_ELEM * (n_in + 1)


def validate_dims(frame: pd.DataFrame) -> None:
    """Raise a ValueError naming the rows whose class dims are missing, zero or negative."""
    gemm = frame["cls"].isin(GEMM_CLASSES).to_numpy()
    for cols, mask in ((["B", "M", "N", "K"], gemm), (["B", "H"], ~gemm)):
        vals = frame.loc[mask, cols].to_numpy(float)
        bad = ~(vals > 0).all(axis=1)  # NaN compares False: missing dims are bad too
        if bad.any():
            rows = frame.loc[mask].index[bad][:5].tolist()
            raise ValueError(f"kernel dims {cols} must be positive numbers; bad rows {rows} "
                             f"(first of {int(bad.sum())}): fix the dims of those kernels")


def flops_bytes(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Exact FLOPs and bytes moved (FP32) of each kernel, method.md section 2."""
    B, M, N, K, H = (frame[c].to_numpy(float) for c in DIM_COLS)
    gemm = frame["cls"].isin(GEMM_CLASSES).to_numpy()
    ops_per_o, mem_per_o = _per_output(frame["op"])
    flops = np.where(gemm, 2 * B * M * N * K, B * H * ops_per_o)
    nbytes = np.where(gemm, BYTES_PER_ELEM * B * (M * N + N * K + M * K), B * H * mem_per_o)
    return flops, nbytes


def elem_bytes(frame: pd.DataFrame) -> np.ndarray:
    """Bytes per element each GEMM or vector row of a trace was counted with: its ``bytes``
    over the FP32 bytes of its dims, times :data:`BYTES_PER_ELEM` (4 in an FP32 trace; 2 for
    the 16-bit kernels of a 16-bit trace). NaN for rows of other classes."""
    known = frame["cls"].isin(CLASSES).to_numpy()
    out = np.full(len(frame), np.nan)
    if known.any():
        _, fp32 = flops_bytes(frame[known])
        out[known] = BYTES_PER_ELEM * frame.loc[known, "bytes"].to_numpy(float) / fp32
    return out


def vector_tile(n_out: np.ndarray, grid_blocks: np.ndarray) -> np.ndarray:
    """Outputs per thread block of an elementwise kernel: ``2**ceil(log2(n_out / grid))``."""
    return 2.0 ** np.ceil(np.log2(np.maximum(n_out / grid_blocks, 1.0)))


# split-K, as the library chooses it (docs/decisions.md 13): slices of at least SPLIT_MIN_SLICE
# elements of the reduction, at most SPLIT_MAX, the fewest whose wave-quantised time is within
# SPLIT_TOLERANCE of the best split's. Of the settings tried (64-2048 elements, 5-30%), these
# agree best with the splits the training GPUs' cuBLAS launched (grid z of the training GEMMs)
SPLIT_MIN_SLICE = 128
SPLIT_MAX = 64
SPLIT_TOLERANCE = 0.1


def gemv_tiles(M, K, tm, tk, gemm) -> tuple[np.ndarray, np.ndarray]:
    """Output tile (rows, columns) a GEMM runs with: a one-row or one-column output is a
    matrix-vector product, which the library runs as a stream over the matrix (no tile padded
    to 32-128 outputs in the vector's dimension: the tile there is 1)."""
    return (np.where(gemm & (M == 1), 1.0, tm), np.where(gemm & (K == 1), 1.0, tk))


def gemv_rows(frame: pd.DataFrame) -> np.ndarray:
    """Mask of the GEMMs of ``frame`` with a one-row or one-column output (matrix-vector)."""
    gemm = frame["cls"].isin(GEMM_CLASSES).to_numpy()
    M, K = frame["M"].to_numpy(float), frame["K"].to_numpy(float)
    return gemm & ((M == 1) | (K == 1))


def gemv_as_stream(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each matrix-vector GEMM (:func:`gemv_rows`) as the elementwise stream
    that moves the same bytes: one read of the matrix, of the vector and one write of the
    output (a one-input elementwise op, ``addu``, of half that many bytes' elements at 8
    bytes each). The library's GEMV reads the matrix once with no reuse to exploit: its time
    is a stream's, whose efficiency the elementwise kernels measure on every GPU. Tiles and
    derived columns of those rows are dropped (they are looked up again)."""
    mask = gemv_rows(frame)
    if not mask.any():
        return frame
    out = frame.copy()
    B, M, N, K = (out.loc[mask, c].to_numpy(float) for c in ("B", "M", "N", "K"))
    elems = BYTES_PER_ELEM * B * (M * N + N * K + M * K) / (2 * BYTES_PER_ELEM)
    out.loc[mask, ["cls", "op"]] = ["elementwise", "addu"]
    out.loc[mask, "B"], out.loc[mask, "H"] = 1.0, np.ceil(elems)
    out.loc[mask, ["M", "N", "K"]] = np.nan
    for c in ("tile", "tile_m", "tile_k"):
        if c in out:
            out.loc[mask, c] = np.nan
    return out


def split_k(tiles_out, N, num_sm) -> np.ndarray:
    """Slices of the reduction ``N`` a GEMM with ``tiles_out`` output tiles runs on ``num_sm``
    SMs (split-K), >= 1. Each slice is a block, so ``S`` slices take
    ``ceil(tiles_out * S / num_sm) / S`` waves of whole-reduction tiles: a GEMM with too few
    tiles to fill the SMs (or a ragged last wave) gains from splitting. The split is the
    fewest slices within :data:`SPLIT_TOLERANCE` of the best, no slice shorter than
    :data:`SPLIT_MIN_SLICE`; their partial outputs are then summed by a reduce."""
    tiles_out, N, num_sm = (np.atleast_1d(np.asarray(a, float)) for a in (tiles_out, N, num_sm))
    tiles_out, N, num_sm = np.broadcast_arrays(np.maximum(tiles_out, 1.0), N, num_sm)
    S = np.arange(1, SPLIT_MAX + 1, dtype=float)[None, :]
    most = np.maximum(np.floor(np.nan_to_num(N) / SPLIT_MIN_SLICE), 1.0)[:, None]
    cost = np.ceil(tiles_out[:, None] * S / num_sm[:, None]) / S
    cost = np.where(S <= most, cost, np.inf)
    good = cost <= cost.min(axis=1, keepdims=True) * (1 + SPLIT_TOLERANCE)
    return (np.argmax(good, axis=1) + 1).astype(float)


def add_features(frame: pd.DataFrame, library: bool = True) -> pd.DataFrame:
    """Return a copy of ``frame`` with FLOPs, bytes, blocks, waves and roofline columns.

    ``library``: GEMMs run as the library runs them (a one-row or one-column output tiled as
    the vector it is, :func:`gemv_tiles`; split-K, :func:`split_k`); ``False`` sizes them as
    method.md section 3 states (every block reads the whole reduction, tiles as given), the
    sizing of NeuSight as published.

    Needs the dims, ``cls``, ``op``, the GPU columns and the tile columns: ``tile_m``,
    ``tile_k`` for GEMMs (output tile rows x columns) and ``tile`` (outputs per block) for
    elementwise ops; softmax and layernorm tiles are one row (H). Adds ``flops``, ``bytes``,
    ``blocks``, ``waves``, ``tile_flops``, ``tile_bytes``, ``intensity`` (FLOP/byte, on the
    tile-padded sizes) and ``roofline_tput`` (FLOP/s).
    """
    validate_dims(frame)
    out = frame.copy()
    flops, nbytes = flops_bytes(out)
    B, M, N, K, H = (out[c].to_numpy(float) for c in DIM_COLS)
    cls = out["cls"].to_numpy()
    gemm = np.isin(cls, GEMM_CLASSES)
    row = np.isin(cls, ("softmax", "layernorm"))
    ops_per_o, mem_per_o = _per_output(out["op"])

    tm, tk = out.get("tile_m", np.nan), out.get("tile_k", np.nan)
    tm = np.asarray(tm, float) * np.ones(len(out))
    tk = np.asarray(tk, float) * np.ones(len(out))
    tile = np.where(row, H, np.asarray(out.get("tile", np.nan), float) * np.ones(len(out)))
    if (gemm & ~((tm > 0) & (tk > 0))).any() or (~gemm & ~(tile > 0)).any():
        raise ValueError("add_features needs positive tile sizes (tile_m, tile_k for GEMMs, "
                         "tile for elementwise ops): parse them (nslib.kernels.measured) or look them up "
                         "(nslib.kernels.tiles) first")
    if library:
        tm, tk = gemv_tiles(M, K, tm, tk, gemm)
    Mp, Kp = np.ceil(M / tm) * tm, np.ceil(K / tk) * tk
    tiles_out = B * np.ceil(M / tm) * np.ceil(K / tk)
    split = np.where(gemm & library, split_k(tiles_out, N, out["num_sm"].to_numpy(float)), 1.0)
    blocks = np.where(gemm, tiles_out * split, np.where(row, B, np.ceil(B * H / tile)))
    tile_flops = np.where(gemm, 2 * tm * (N / split) * tk, tile * ops_per_o)
    tile_bytes = np.where(gemm, BYTES_PER_ELEM * (tm * N / split + N / split * tk + tm * tk),
                          tile * mem_per_o)
    # split-K writes each slice's partial output and a reduce kernel reads them back
    nbytes = nbytes + np.where(gemm & (split > 1), 2 * BYTES_PER_ELEM * B * M * K * split, 0.0)
    pad_flops = np.where(gemm, 2 * B * Mp * N * Kp, flops)
    pad_bytes = np.where(gemm, BYTES_PER_ELEM * B * (Mp * N + N * Kp + Mp * Kp), nbytes)
    intensity = pad_flops / pad_bytes
    peak = out["peak_gflops"].to_numpy(float) * 1e9
    bw = out["mem_bw"].to_numpy(float) * 1e9
    out["tile"] = tile
    out["tile_m"], out["tile_k"] = np.where(gemm, tm, out.get("tile_m", np.nan)), \
        np.where(gemm, tk, out.get("tile_k", np.nan))
    out["split"] = split
    out["flops"], out["bytes"] = flops, nbytes
    out["blocks"] = blocks
    out["waves"] = np.ceil(blocks / out["num_sm"].to_numpy(float))
    out["tile_flops"], out["tile_bytes"] = tile_flops, tile_bytes
    out["intensity"] = intensity
    out["roofline_tput"] = np.minimum(peak, intensity * bw)
    return out


def roofline_ms(frame: pd.DataFrame) -> np.ndarray:
    """Classic roofline latency in ms: ``max(FLOPs / peak, bytes / bandwidth)``.

    Uses the exact (unpadded) FLOPs and bytes, so it needs no tile.
    """
    flops, nbytes = flops_bytes(frame)
    peak = frame["peak_gflops"].to_numpy(float) * 1e9
    bw = frame["mem_bw"].to_numpy(float) * 1e9
    return np.maximum(flops / peak, nbytes / bw) * 1e3
