import numpy as np
import pandas as pd
import pytest

from nslib.kernels import sizes
from nslib.kernels.measured import parse_gemm_tile


def gemm(B, M, N, K, tm, tk, cls="bmm", sm=80):
    return pd.DataFrame({"cls": [cls], "op": [cls], "B": [float(B)], "M": [float(M)],
                         "N": [float(N)], "K": [float(K)], "H": [np.nan], "tile_m": [tm],
                         "tile_k": [tk], "num_sm": [sm], "peak_gflops": [14029.0],
                         "mem_bw": [900.0], "mem_gb": [32.0], "l2_mb": [6.0]})


@pytest.mark.parametrize("name,M,K,gx,gy,want", [
    # Maxwell (P4/P100): first number K-side, second M-side
    ("maxwell_sgemm_128x64_nn", 27, 29, 1, 1, (64, 128)),
    ("maxwell_sgemm_32x128_tn", 1000, 100, 4, 8, (128, 32)),
    # Volta (V100) and Turing (T4 runs the volta kernels)
    ("volta_sgemm_32x128_nn", 128, 128, 4, 1, (128, 32)),
    ("volta_sgemm_128x64_tn", 1024, 2560, 20, 16, (64, 128)),
    ("volta_sgemm_64x32_sliced1x4_tn", 100, 200, 4, 4, (32, 64)),
    # Ampere (A100)
    ("ampere_sgemm_128x32_sliced1x4_tn", 4096, 1024, 8, 128, (32, 128)),
    ("void cutlass::Kernel<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(x::Params)",
     512, 1024, 4, 4, (128, 256)),
    # Hopper (H100) runs xmma kernels whose tilesize lists the M-side first
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x128x8_stage3_warpsize1x4x1_ffma_"
     "aligna4_alignc4_execute_kernel__5x_cublas", 1000, 1000, 16, 8, (64, 128)),
    # Pascal legacy names
    ("sgemm_128x128x8_NT_vec", 300, 300, 3, 3, (128, 128)),
])
def test_tile_parsing_each_generation(name, M, K, gx, gy, want):
    tm, tk = parse_gemm_tile(pd.Series([name]), [M], [K], [gx], [gy])
    assert (tm[0], tk[0]) == want


def test_tile_parsing_unknown_name_is_nan():
    tm, tk = parse_gemm_tile(pd.Series(["gemv2T_kernel"]), [4], [4], [1], [1])
    assert np.isnan(tm[0]) and np.isnan(tk[0])


def test_gemm_waves_hand_checked():
    # 3 x ceil(300/128)=3 x ceil(200/64)=4 -> 36 blocks on 80 SMs: 1 wave
    f = sizes.add_features(gemm(3, 300, 50, 200, 128, 64))
    assert f["blocks"][0] == 36 and f["waves"][0] == 1
    # 64 x 8 x 8 = 4096 blocks on 80 SMs -> ceil(51.2) = 52 waves
    f = sizes.add_features(gemm(64, 1024, 64, 512, 128, 64))
    assert f["blocks"][0] == 4096 and f["waves"][0] == 52
    assert f["flops"][0] == 2 * 64 * 1024 * 64 * 512
    assert f["bytes"][0] == 4 * 64 * (1024 * 64 + 64 * 512 + 1024 * 512)
    assert f["tile_flops"][0] == 2 * 128 * 64 * 64


def test_vector_tiles_and_waves():
    # add of 127 x 168 launched on 42 blocks: 512 outputs per block, 42 blocks, 2 waves on 40 SMs
    tile = sizes.vector_tile(np.array([127 * 168.0]), np.array([42.0]))
    assert tile[0] == 512
    df = pd.DataFrame({"cls": ["elementwise", "softmax"], "op": ["add", "softmax"],
                       "B": [127.0, 1000.0], "H": [168.0, 64.0], "M": np.nan, "N": np.nan,
                       "K": np.nan, "tile": [512.0, np.nan], "num_sm": [40.0, 40.0],
                       "peak_gflops": 5699.0, "mem_bw": 192.0, "mem_gb": 8.0, "l2_mb": 2.0})
    f = sizes.add_features(df)
    assert f["blocks"].tolist() == [42, 1000] and f["waves"].tolist() == [2, 25]
    assert f["bytes"].tolist() == [127 * 168 * 12, 1000 * 64 * 8]
    assert f["flops"].tolist() == [127 * 168, 1000 * 64 * 5]
    assert f["intensity"].tolist() == [1 / 12, 5 / 8]


def test_roofline_hand_checked():
    f = gemm(1, 1024, 1024, 1024, 128, 128)
    flops, nbytes = 2 * 1024**3, 4 * 3 * 1024**2
    assert sizes.roofline_ms(f)[0] == pytest.approx(max(flops / 14029e9, nbytes / 900e9) * 1e3)


@pytest.mark.parametrize("dim", ["B", "M", "N", "K"])
@pytest.mark.parametrize("val", [0, -4, np.nan])
def test_bad_dims_rejected(dim, val):
    f = gemm(2, 8, 8, 8, 32, 32)
    f[dim] = val
    with pytest.raises(ValueError, match="must be positive"):
        sizes.add_features(f)


def test_unknown_op_rejected():
    with pytest.raises(ValueError, match="unknown op"):
        sizes.op_class(pd.Series(["conv"]))


def test_backward_vector_ops_move_one_more_tensor():
    import pandas as pd

    from nslib.kernels.sizes import FORWARD_OP, OPS, bytes_ratio_to_forward, flops_bytes
    assert bytes_ratio_to_forward("softmax_bw") == 1.5 and bytes_ratio_to_forward("ln") == 1.0
    for bw, fw in FORWARD_OP.items():
        assert OPS[bw][0] == OPS[fw][0]  # same class: the forward's predictor prices it
    f = pd.DataFrame({"cls": "softmax", "op": ["softmax", "softmax_bw", "logsoftmax_bw"],
                      "B": 8.0, "M": float("nan"), "N": float("nan"), "K": float("nan"),
                      "H": 1024.0})
    flops, nbytes = flops_bytes(f)
    assert list(nbytes) == [2 * 8 * 1024 * 4, 3 * 8 * 1024 * 4, 3 * 8 * 1024 * 4]
    # per element: max, exp, sum, divide, (subtract); the row kernel after CUDA's product
    # kernel: sum, times the output, subtract; the log-softmax's: exp of the output too
    assert list(flops / (8 * 1024)) == [5, 3, 4]


def test_split_k_fills_the_waves_by_hand():
    from nslib.kernels.sizes import SPLIT_MIN_SLICE, split_k
    # 4 output tiles on 108 SMs: 25 slices (1 wave of 100 blocks) is within 10% of 27's
    assert split_k(4, 131072, 108)[0] == 25
    # a GEMM that fills many waves is not split; nor a reduction shorter than two slices
    assert split_k(1000, 4096, 108)[0] == 1
    assert split_k(4, SPLIT_MIN_SLICE + 1, 108)[0] == 1
    # never more slices than the reduction has minimum-length slices
    assert split_k(1, 4 * SPLIT_MIN_SLICE, 108)[0] == 4


def test_gemm_features_as_the_library_runs_them():
    import numpy as np
    import pandas as pd

    from nslib.kernels import sizes
    gpu = {"num_sm": 108.0, "peak_gflops": 19500.0, "mem_bw": 1555.0, "mem_gb": 40.0,
           "l2_mb": 40.0}
    f = pd.DataFrame([{"cls": "linear", "op": "linear", "B": 1.0, "M": 256.0, "N": 131072.0,
                       "K": 1.0, "H": np.nan, "tile_m": 128.0, "tile_k": 128.0, **gpu},
                      {"cls": "linear", "op": "linear", "B": 1.0, "M": 256.0, "N": 131072.0,
                       "K": 256.0, "H": np.nan, "tile_m": 128.0, "tile_k": 128.0, **gpu}])
    out = sizes.add_features(f)
    # matrix-vector: the column tile is 1, two row tiles split 50 ways (within 10% of 54)
    assert out["tile_k"].tolist() == [1.0, 128.0]
    assert out["split"].tolist() == [50.0, 25.0]
    assert out["blocks"].tolist() == [100.0, 100.0]
    assert out["tile_flops"].iat[1] == 2 * 128 * 128 * 131072 / 25
    # the partial outputs are written and read back
    assert out["bytes"].iat[1] == 4 * (256 * 131072 * 2 + 256 * 256) + 2 * 4 * 256 * 256 * 25
    stream = sizes.gemv_as_stream(out)
    assert stream["cls"].tolist() == ["elementwise", "linear"]
    assert stream["H"].iat[0] * 8 == 4 * (256 * 131072 + 131072 + 256)
