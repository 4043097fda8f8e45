"""Properties of the kernel sizing laws over random shapes and GPUs (hypothesis): split-K, the
matrix-vector stream, vector tiles and the roofline, each against what its docstring states."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from nslib.kernels import sizes

dims = st.integers(min_value=1, max_value=1 << 20)
tiles = st.integers(min_value=1, max_value=100_000)
sms = st.integers(min_value=1, max_value=200)
PROFILE = settings(max_examples=300, deadline=None)


def _waves(tiles_out, S, num_sm):
    """The wave-quantised cost split_k minimises: ceil(tiles * S / SMs) / S."""
    return math.ceil(tiles_out * S / num_sm) / S


@PROFILE
@given(tiles, dims, sms)
def test_split_k_is_within_tolerance_of_the_best_allowed_split(t, N, num_sm):
    S = int(sizes.split_k(t, N, num_sm)[0])
    most = max(N // sizes.SPLIT_MIN_SLICE, 1)
    assert 1 <= S <= min(sizes.SPLIT_MAX, most)           # no slice shorter than the minimum
    allowed = [_waves(t, s, num_sm) for s in range(1, min(sizes.SPLIT_MAX, most) + 1)]
    assert _waves(t, S, num_sm) <= min(allowed) * (1 + sizes.SPLIT_TOLERANCE) + 1e-12
    # the fewest such slices: any smaller split is worse than the tolerance allows
    assert all(_waves(t, s, num_sm) > min(allowed) * (1 + sizes.SPLIT_TOLERANCE)
               for s in range(1, S))
    assert _waves(t, S, num_sm) <= _waves(t, 1, num_sm)   # splitting never costs waves


@PROFILE
@given(tiles, sms)
def test_a_short_reduction_is_never_split(t, num_sm):
    assert sizes.split_k(t, sizes.SPLIT_MIN_SLICE * 2 - 1, num_sm)[0] == 1


@PROFILE
@given(st.integers(1, 64), dims, dims, st.sampled_from(["M", "K"]))
def test_a_matrix_vector_product_streams_its_bytes(B, long_side, N, which):
    M, K = (1, long_side) if which == "M" else (long_side, 1)
    frame = pd.DataFrame({"cls": ["linear"], "op": ["linear"], "B": [float(B)], "M": [float(M)],
                          "N": [float(N)], "K": [float(K)], "H": [np.nan]})
    assert sizes.gemv_rows(frame).all()
    out = sizes.gemv_as_stream(frame)
    assert out["cls"].iat[0] == "elementwise"
    _, gemm_bytes = sizes.flops_bytes(frame)
    _, stream_bytes = sizes.flops_bytes(out)
    # the same bytes moved (the element count is rounded up to a whole element)
    assert gemm_bytes[0] <= stream_bytes[0] <= gemm_bytes[0] + 3 * sizes.BYTES_PER_ELEM


@PROFILE
@given(st.integers(1, 1 << 30), st.integers(1, 1 << 20))
def test_vector_tile_is_the_power_of_two_that_covers_a_block(n_out, blocks):
    tile = sizes.vector_tile(np.array([float(n_out)]), np.array([float(blocks)]))[0]
    assert tile >= 1 and math.log2(tile) == int(math.log2(tile))
    assert tile * blocks >= n_out or tile == 1.0
    assert tile < 2 * max(n_out / blocks, 1.0)


@PROFILE
@given(dims, dims, dims, st.floats(1e3, 1e5), st.floats(100, 8000), st.floats(1.0, 4.0))
def test_roofline_never_slower_on_a_faster_gpu(M, N, K, peak, bw, more):
    frame = pd.DataFrame({"cls": ["bmm"], "op": ["bmm"], "B": [1.0], "M": [float(M)],
                          "N": [float(N)], "K": [float(K)], "H": [np.nan],
                          "peak_gflops": [peak], "mem_bw": [bw]})
    base = sizes.roofline_ms(frame)[0]
    assert sizes.roofline_ms(frame.assign(peak_gflops=peak * more))[0] <= base
    assert sizes.roofline_ms(frame.assign(mem_bw=bw * more))[0] <= base
    assert base >= 2.0 * M * N * K / (peak * 1e9) * 1e3 * (1 - 1e-12)
