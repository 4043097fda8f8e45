"""FlashAttention kernels as a kernel *kind*: FLOPs, DRAM bytes, roofline and launch geometry.

A row is one attention call: ``batch`` sequences, ``heads`` query heads sharing ``kv_heads``
key/value heads (GQA), ``head_dim`` per head, ``q_len`` queries against ``kv_len`` keys,
``causal`` (prefill: each query sees the keys up to its own position, the mask aligned to the
bottom right as FlashAttention does when ``q_len < kv_len``). 16-bit activations: 2 bytes per
element. The peak is the tensor-core one (``bf16_gflops`` GFLOP/s), the bandwidth ``mem_bw``
(GB/s).

Launch geometry is the one FlashAttention's forward kernels use, GPU-free in the tile sizes:
query blocks of ``BLOCK_M`` = 128 rows, key blocks of 128 columns for ``head_dim`` <= 64 and 64
above (FA2's choices: a bigger head fills the shared memory sooner); one CTA per (sequence,
head, query block). Decode (one query) packs the query heads of a KV group into one CTA per
(sequence, KV head) and splits the keys (flash-decoding) until the CTAs fill the SMs.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.predictors.tensor_baselines import roofline_ms

BYTES = 2            # bytes per element, bf16/fp16
BLOCK_M = 128        # query rows per CTA
MAX_SPLITS = 128     # FlashAttention caps the key splits of one (sequence, KV head) at 128
FILL_SPLIT = 0.8     # split the keys only when the unsplit CTAs fill under 80% of the SMs
SHAPE_COLUMNS = ("batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim", "causal")


def check_frame(frame: pd.DataFrame, gpu: bool = False, extra: tuple = ()) -> None:
    """ValueError naming the missing or bad columns of an attention frame (``gpu``: with the
    peak, bandwidth and SM count; ``extra``: more positive columns a caller needs)."""
    need = list(SHAPE_COLUMNS) + (["bf16_gflops", "mem_bw", "num_sm"] if gpu else []) + \
        list(extra)
    lacking = [c for c in need if c not in frame.columns]
    if lacking:
        raise ValueError(f"attention frame lacks column(s) {lacking}; build it with "
                         "nslib.data.mixed_data.attention_table() or add them")
    num = [c for c in need if c != "causal"]
    vals = frame[num].to_numpy(float)
    if len(frame) and not (np.isfinite(vals).all() and (vals > 0).all()):
        bad = [c for c, ok in zip(num, (np.isfinite(vals) & (vals > 0)).all(axis=0)) if not ok]
        raise ValueError(f"attention column(s) {bad} must be positive and finite (a GPU "
                         "without Bf16FLOPs in its datasheet cannot run a 16-bit prediction: "
                         "add the figure to its JSON)")
    q, kv = frame["q_len"].to_numpy(float), frame["kv_len"].to_numpy(float)
    if (q > kv).any():
        raise ValueError("q_len > kv_len in some rows: queries attend to their own keys, so "
                         "kv_len (cached plus new tokens) must be at least q_len")
    h, g = frame["heads"].to_numpy(float), frame["kv_heads"].to_numpy(float)
    if (h % g != 0).any():
        raise ValueError("heads must be a multiple of kv_heads (GQA groups of query heads)")


def _cols(frame: pd.DataFrame):
    return [frame[c].to_numpy(float) for c in SHAPE_COLUMNS[:-1]] + \
        [frame["causal"].to_numpy(bool)]


def score_pairs(q: np.ndarray, kv: np.ndarray, causal: np.ndarray) -> np.ndarray:
    """(query, key) pairs one head of one sequence computes: ``q * kv``, or with the causal
    mask (bottom-right aligned) exactly the kept ones, ``q * kv - q * (q - 1) / 2``
    (``q * (q + 1) / 2`` when ``q == kv``)."""
    return np.where(causal, q * kv - q * (q - 1) / 2, q * kv)


class AttentionKind:
    """The ``attention`` kind of the 16-bit kernel predictors (see the module docstring)."""

    name = "attention"

    def flops(self, frame: pd.DataFrame) -> np.ndarray:
        """FLOP of each row: ``QK^T`` and ``PV``, 2 FLOP per multiply-add each, over the kept
        score pairs: ``4 * batch * heads * head_dim * score_pairs`` (softmax not counted)."""
        check_frame(frame)
        b, q, kv, h, _, d, causal = _cols(frame)
        return 4.0 * b * h * d * score_pairs(q, kv, causal)

    def bytes(self, frame: pd.DataFrame) -> np.ndarray:
        """Minimum DRAM bytes of each row: read Q and write O (``batch * q_len * heads *
        head_dim`` each), read K and V once (``batch * kv_len * kv_heads * head_dim`` each),
        2 bytes per element."""
        check_frame(frame)
        b, q, kv, h, g, d, _ = _cols(frame)
        return BYTES * (2 * b * q * h * d + 2 * b * kv * g * d)

    def shape_features(self, frame: pd.DataFrame) -> np.ndarray:
        """(n, 7) raw positive shape inputs: batch, q_len, kv_len, heads, kv_heads, head_dim,
        and causal as 2 (masked) or 1."""
        check_frame(frame)
        b, q, kv, h, g, d, causal = _cols(frame)
        return np.column_stack([b, q, kv, h, g, d, np.where(causal, 2.0, 1.0)])


ATTENTION = AttentionKind()


def attention_roofline_ms(frame: pd.DataFrame) -> np.ndarray:
    """Roofline latency (ms) of each row: ``max(FLOP / tensor-core peak, bytes / bandwidth)``
    with the peak ``bf16_gflops * 1e9`` FLOP/s and bandwidth ``mem_bw * 1e9`` B/s."""
    check_frame(frame, gpu=True)
    return roofline_ms(ATTENTION, frame)


def block_n(head_dim: np.ndarray) -> np.ndarray:
    """Key columns per block: 128 for head_dim <= 64, else 64."""
    return np.where(head_dim <= 64, 128.0, 64.0)


def split_block_n(head_dim: np.ndarray) -> np.ndarray:
    """Key columns per block of the split-key (decode) kernel: 256, 128, 64 for head_dim
    <= 64, <= 128, above."""
    return np.where(head_dim <= 64, 256.0, np.where(head_dim <= 128, 128.0, 64.0))


def num_splits(base: np.ndarray, sm: np.ndarray, n_blocks: np.ndarray) -> np.ndarray:
    """FlashAttention's key-split count: 1 when the ``base`` CTAs fill 80% of the ``sm`` SMs;
    else the fewest splits (of at most min(SMs, key blocks, 128)) whose wave efficiency
    (waves / ceil(waves)) is within 85% of the best, skipping counts that give the same
    blocks per split as one fewer."""
    out = np.ones(len(base))
    todo = np.flatnonzero(base < FILL_SPLIT * sm)  # only these rows split at all
    base, sm, n_blocks = base[todo], sm[todo], n_blocks[todo]
    limit = np.minimum(np.minimum(sm, n_blocks), MAX_SPLITS)
    effs = np.zeros((len(todo), MAX_SPLITS))
    for s in range(1, MAX_SPLITS + 1):  # a loop over split counts, vectorised over rows
        waves = base * s / sm
        same = np.ceil(n_blocks / s) == np.ceil(n_blocks / max(s - 1, 1))
        ok = (s <= limit) & ((s == 1) | ~same)
        effs[:, s - 1] = np.where(ok, waves / np.ceil(waves), 0.0)
    good = (effs >= 0.85 * effs.max(axis=1, keepdims=True)) & (effs > 0)
    out[todo] = np.argmax(good, axis=1) + 1.0
    return out


def launch_geometry(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """FlashAttention's launch of each row on its GPU (``num_sm``).

    Returns ``ctas`` (thread blocks), ``waves`` (``ceil(ctas / num_sm)``), ``fill`` (ctas over
    waves * num_sm, in (0, 1]), ``splits`` (key splits, 1 for prefill) and ``tile_flops``
    (FLOP the CTAs compute with their blocks padded: a masked block is computed whole).
    Decode rows (``q_len == 1``) put a KV group's query heads in one CTA.
    """
    check_frame(frame)
    b, q, kv, h, g, d, causal = _cols(frame)
    sm = frame["num_sm"].to_numpy(float)
    bn = block_n(d)
    decode = q == 1
    rows = np.where(decode, h / g, q)  # query rows a (sequence, head-or-group) has
    heads = np.where(decode, g, h)
    n_m = np.ceil(rows / BLOCK_M)
    n_kv = np.ceil(kv / bn)
    # causal: query block i sees keys up to offset + (i + 1) * BLOCK_M (offset = kv - q)
    ratio = BLOCK_M / bn
    tri = np.ceil((kv - q) / bn) * n_m + ratio * n_m * (n_m + 1) / 2
    blocks = np.where(causal & ~decode, np.minimum(tri, n_m * n_kv), n_m * n_kv)
    base = b * heads * n_m
    splits = np.where(decode, num_splits(base, sm, np.ceil(kv / split_block_n(d))), 1.0)
    ctas = base * splits
    waves = np.ceil(ctas / sm)
    tile_rows = np.where(decode, rows, BLOCK_M)  # decode's block holds only the group's rows
    tile_flops = 4.0 * b * heads * d * tile_rows * bn * blocks
    return {"ctas": ctas, "waves": waves, "fill": ctas / (waves * sm), "splits": splits,
            "tile_flops": tile_flops}
