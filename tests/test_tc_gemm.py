"""BF16 GEMM kind, tile heuristic and the NeuSight-style predictor (quick settings, subsamples)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nslib.kernels.tc_tiles import choose_tiles
from nslib.predictors import predictor_class
from nslib.predictors.tc_gemm import GEMM, TensorGemm, gemm_terms, law_ms

# a datasheet outside the training range (B200-like): 2.25 PFLOP/s, 7.7 TB/s, 126 MB L2
FAST = {"gpu": "fast", "num_sm": 148, "peak_gflops": 80000.0, "bf16_gflops": 2.25e6,
        "mem_bw": 7700.0, "mem_gb": 180.0, "l2_mb": 126.0, "clock_mhz": 1965.0}


def test_flops_and_bytes_by_hand():
    f = pd.DataFrame({"m": [2.0, 1.0], "n": [3.0, 4096.0], "k": [4.0, 4096.0]})
    assert GEMM.flops(f).tolist() == [48.0, 2 * 4096 * 4096]
    # A 2x4, B 4x3, C 2x3 = 26 elements of 2 bytes
    assert GEMM.bytes(f).tolist() == [52.0, 2.0 * (4096 + 4096 * 4096 + 4096)]
    assert GEMM.shape_features(f).shape == (2, 3) and GEMM.name == "gemm"
    with pytest.raises(ValueError, match="lacks column"):
        GEMM.flops(f.drop(columns="k"))


def test_tile_choice_by_hand():
    # 4096^3 on 132 SMs: 256x128 -> 512 CTAs, 4 waves of 4096*(32+12)+600 clocks = 723,296;
    # 128x128 -> 8 waves of 4096*(16+8)+600 = 791,232; 256x128 wins the tie with 128x256
    big = choose_tiles([4096], [4096], [4096], [132]).iloc[0]
    assert (big.tile_m, big.tile_n, big.split, big.waves) == (256, 128, 1, 4)
    # decode m=1, n=k=4096: 64x128 split 4 -> 128 CTAs, one wave of 1024*14+600 plus
    # 4096*4*4/64 = 1024 of fp32 partials = 15,960; no split: 4096*14+600 = 57,944
    dec = choose_tiles([1], [4096], [4096], [132]).iloc[0]
    assert (dec.tile_m, dec.tile_n, dec.split, dec.ctas) == (64, 128, 4, 128)
    assert dec.fill == pytest.approx(128 / 132)
    # an L40S-like SM (512 MACs per clock) on 4096^3: 256x128 costs 4 * (4096 * (64 + 12) +
    # 600) = 1,247,584 clocks at 142 SMs, 128x128 8 * (4096 * (32 + 8) + 600) = 1,315,520
    slow = choose_tiles([4096], [4096], [4096], [142], 512.0).iloc[0]
    assert (slow.tile_m, slow.tile_n, slow.waves) == (256, 128, 4)
    with pytest.raises(ValueError, match="positive finite num_sm"):
        choose_tiles([1], [1], [1], [0])


@pytest.fixture(scope="module")
def table(mixed_dir):
    from nslib.data.mixed_data import gemm_table
    t = gemm_table(mixed_dir)
    return t.groupby("gpu", group_keys=False).sample(n=1500, random_state=0).reset_index(drop=True)


@pytest.fixture(scope="module")
def trained(table):
    return TensorGemm(quick=True).fit(table, progress=False)


def _fast_frame(m, n, k) -> pd.DataFrame:
    return pd.DataFrame({"m": np.asarray(m, float), "n": np.asarray(n, float),
                         "k": np.asarray(k, float), **{c: v for c, v in FAST.items()}})


def test_never_below_roofline(trained, table):
    grid = np.array(np.meshgrid([1, 16, 512, 8192], [64, 4096, 65536], [64, 4096, 65536]))
    frames = [table, _fast_frame(*grid.reshape(3, -1))]
    for f in frames:
        pred = trained.predict(f)
        peak, bw = f["bf16_gflops"].to_numpy() * 1e9, f["mem_bw"].to_numpy() * 1e9
        beyond = np.maximum(2.0 * (f.m * f.k + f.k * f.n + f.m * f.n) - f.l2_mb * 1e6, 0)
        roof = 1e3 * np.maximum(2.0 * f.m * f.n * f.k / peak, beyond.to_numpy() / bw)
        assert np.all(np.isfinite(pred)) and np.all(pred >= roof * (1 - 1e-9))


def test_peak_and_bandwidth_scale_big_gemm(trained):
    base = _fast_frame([16384], [16384], [16384])
    fast = base.assign(bf16_gflops=base.bf16_gflops * 4, mem_bw=base.mem_bw * 4)
    ratio = trained.predict(fast)[0] / trained.predict(base)[0]
    assert ratio == pytest.approx(0.25, rel=0.02)
    # the roofline alone: 2 * 16384^3 / 2.25e15 s = 3.9 ms; the prediction is above it
    assert trained.predict(base)[0] >= 2 * 16384.0 ** 3 / 2.25e15 * 1e3


def test_save_load_round_trip(trained, table, tmp_path):
    path = trained.save(tmp_path / "gemm.npz")
    again = TensorGemm.load(path)
    np.testing.assert_allclose(again.predict(table), trained.predict(table), rtol=1e-12)
    assert again.config == trained.config and predictor_class("nslib", "gemm") is TensorGemm


def test_bad_input_is_a_clear_error(trained, table):
    with pytest.raises(ValueError, match="bf16_gflops"):
        trained.predict(table.assign(bf16_gflops=np.nan))
    with pytest.raises(ValueError, match="unknown GEMM feature"):
        TensorGemm(features=("nope",))
    with pytest.raises(ValueError, match="not trained"):
        TensorGemm().predict(table)


def test_law_by_hand():
    # raw 0: efficiencies at their bounds' middle, both fixed costs at their scale
    ctx = np.array([[1.0, 0.3, 0.1, 0.002, 0.001]])  # comp, dram, roof, 2 us, clocks scale
    got = law_ms(np.zeros((1, 4)), ctx, ("comp", "dram"))
    # comp / 0.5 = 2 beats dram / 0.75 = 0.4; c = 0.002 + 0.001
    assert got[0] == pytest.approx(2.003)
    assert law_ms(np.zeros((1, 3)), ctx[:, :4], ("comp", "dram"))[0] == pytest.approx(2.002)
    with pytest.raises(ValueError, match="fixed="):
        TensorGemm(fixed="hours")


def test_terms_use_the_datasheet_mac_rate(table):
    head = table.head(50)
    rate = head.bf16_gflops * 1e3 / (2 * head.num_sm * head.clock_mhz)
    tiles = choose_tiles(head.m, head.n, head.k, head.num_sm, rate.to_numpy())
    t = gemm_terms(head, macs=True)
    np.testing.assert_array_equal(t["tile_m"], tiles.tile_m)
    np.testing.assert_array_equal(t["waves"], tiles.waves)


def test_terms_follow_the_tiles(table):
    t = gemm_terms(table.head(50))
    tiles = choose_tiles(table.m[:50], table.n[:50], table.k[:50], table.num_sm[:50])
    padded = 2 * tiles.waves * table.num_sm[:50] * tiles.tile_m * tiles.tile_n * \
        np.ceil(table.k[:50] / tiles.split)
    np.testing.assert_allclose(t["comp"], padded / (table.bf16_gflops[:50] * 1e9) * 1e3)
    assert np.all(padded >= GEMM.flops(table.head(50)))


def test_tile_term_counts_the_launched_ctas(table):
    # the tile term is the bytes the CTAs launched load, not a full last wave's: a 1-wave
    # GEMM with a third of the SMs busy loads a third of what every SM would
    t = gemm_terms(table.head(50), macs=True)
    want = 2.0 * t["ctas"] * t["k_split"] * (t["tile_m"] + t["tile_n"]) / \
        (table.mem_bw[:50].to_numpy() * 1e9) * 1e3
    np.testing.assert_allclose(t["tile"], want)


def test_second_cheapest_tile_by_hand():
    # 4096^3 on 132 SMs (test above): 256x128 (723,296 clocks) first, 128x256 ties it and
    # comes second; a GEMM with one usable candidate keeps it at every rank
    second = choose_tiles([4096], [4096], [4096], [132], rank=1).iloc[0]
    assert (second.tile_m, second.tile_n, second.split) == (128, 256, 1)
    tiny = [choose_tiles([1], [1], [1], [1], rank=r).iloc[0] for r in (0, 29, 40)]
    assert all((t.tile_m, t.split) == (tiny[0].tile_m, 1) for t in tiny)


def test_prediction_is_the_fastest_launch(trained, table):
    head = table.head(200)
    launches = list(trained._launches(head))
    assert len(launches) == (1 + len(trained.config["sm_fractions"])) * \
        trained.config["tiles_tried"]
    each = np.array([trained._predict_launch(f, r) for f, r in launches])
    np.testing.assert_allclose(trained.predict(head), each.min(axis=0))
    # a restricted GPU keeps whole SMs and its share of the peaks, all of its L2 and bandwidth
    sub, _ = launches[-1]
    share = sub.num_sm / head.num_sm
    assert np.all(sub.num_sm == np.maximum(np.floor(head.num_sm * 0.25), 1))
    np.testing.assert_allclose(sub.bf16_gflops, head.bf16_gflops * share)
    assert sub.l2_mb.equals(head.l2_mb) and sub.mem_bw.equals(head.mem_bw)


def test_quick_logo_finite_per_gpu(table):
    from nslib.evaluation.kernel_level import logo_over, mape_table
    small = table.groupby("gpu", group_keys=False).head(600).reset_index(drop=True)

    def fit_without(held):   # a fresh quick fit per fold, in place of the cached folds
        return TensorGemm(quick=True).fit(
            small[~small["gpu"].isin([held])].reset_index(drop=True), progress=False)
    held_out = ((g, fit_without(g)) for g in small["gpu"].unique())
    mape = mape_table(small.assign(pred_q=logo_over(small, held_out)))["q"]
    assert len(mape) == small["gpu"].nunique() and np.all(np.isfinite(mape))
    assert np.all(mape < 200)
