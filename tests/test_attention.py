"""The FlashAttention kind (FLOPs, bytes, roofline, launch) by hand, and the NeuSight-style
attention predictor's guarantees: never below the roofline, saved and loaded unchanged,
scaling with the datasheet, and finite leave-one-GPU-out errors on a small subsample."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nslib.predictors import predictor_class
from nslib.predictors.attention import (ATTENTION, TensorAttention,
                                        attention_roofline_ms, floor_ms)
from nslib.predictors.attention_kind import launch_geometry

GPU = {"gpu": "test", "bf16_gflops": 1e6, "mem_bw": 2000.0, "num_sm": 108.0, "l2_mb": 40.0,
       "clock_mhz": 1400.0}


def rows(*shapes) -> pd.DataFrame:
    """Rows of (batch, q_len, kv_len, heads, kv_heads, head_dim, causal) on the GPU above."""
    cols = ["batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim", "causal"]
    frame = pd.DataFrame(shapes, columns=cols)
    for k, v in GPU.items():
        frame[k] = v
    return frame


PREFILL = (2, 1024, 1024, 32, 8, 128, True)
DECODE = (4, 1, 4096, 32, 8, 128, False)


def test_flops_and_bytes_by_hand():
    f = rows(PREFILL, DECODE, (1, 2, 4, 1, 1, 64, True))
    # causal prefill keeps 1024 * 1025 / 2 pairs; 4 FLOP per pair and head_dim element
    assert ATTENTION.flops(f)[0] == 4 * 2 * 32 * 128 * (1024 * 1025 / 2) == 17_196_646_400
    assert ATTENTION.flops(f)[1] == 4 * 4 * 32 * 128 * 4096 == 268_435_456
    # 2 queries against 4 keys, bottom-right mask: query 0 sees 3 keys, query 1 all 4
    assert ATTENTION.flops(f)[2] == 4 * 64 * 7
    # Q and O at 32 heads, K and V at the 8 KV heads, 2 bytes each
    assert ATTENTION.bytes(f)[0] == 2 * (2 * 2 * 1024 * 32 * 128 + 2 * 2 * 1024 * 8 * 128)
    assert ATTENTION.bytes(f)[1] == 2 * (2 * 4 * 32 * 128 + 2 * 4 * 4096 * 8 * 128)
    assert ATTENTION.shape_features(f)[0].tolist() == [2, 1024, 1024, 32, 8, 128, 2]
    assert ATTENTION.shape_features(f)[1, -1] == 1


def test_roofline_by_hand():
    f = rows(PREFILL, DECODE)
    # prefill: 17.2 GFLOP at 1 PFLOP/s is 0.0172 ms, 41.9 MB at 2 TB/s is 0.0210 ms
    np.testing.assert_allclose(attention_roofline_ms(f), [41_943_040 / 2e12 * 1e3,
                                                          67_174_400 / 2e12 * 1e3])
    f["mem_bw"] = 1e5  # now compute-bound: FLOP / peak
    np.testing.assert_allclose(attention_roofline_ms(f)[0], 17_196_646_400 / 1e15 * 1e3)


def test_l2_floor_by_hand():
    f = rows(PREFILL, DECODE)
    f["l2_mb"] = 50.0  # the prefill's 40 MiB fit: only its FLOP bound it; the decode has 14 MiB
    f["mem_bw"] = 1e4  # beyond a 50 MiB L2 (64.06 MiB in all) at 10 TB/s, more than its FLOP
    np.testing.assert_allclose(floor_ms(f), [17_196_646_400 / 1e15 * 1e3,
                                             (67_174_400 - 50 * 2**20) / 1e13 * 1e3])
    assert (floor_ms(f) <= attention_roofline_ms(f)).all()
    np.testing.assert_allclose(floor_ms(f, l2=False), attention_roofline_ms(f))


def test_launch_geometry_by_hand():
    g = launch_geometry(rows(PREFILL, (1, 1, 1024, 32, 8, 128, False),
                             (1, 1, 128, 32, 8, 128, False), (64, 1, 1024, 32, 8, 128, False)))
    assert g["ctas"][0] == 2 * 32 * 8  # (sequence, head, 128-query block)
    # decode: 8 KV heads fill 8 of 108 SMs; 8 key blocks of 128, split 8 ways (7 gives the
    # same blocks per split as 6); one block cannot split; 512 CTAs need no split
    assert g["splits"].tolist() == [1, 8, 1, 1]
    assert g["ctas"][3] == 64 * 8 and g["waves"][3] == 5


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="kv_len"):
        ATTENTION.flops(rows((1, 8, 4, 1, 1, 64, True)))
    with pytest.raises(ValueError, match="Bf16FLOPs"):
        attention_roofline_ms(rows(PREFILL).assign(bf16_gflops=np.nan))
    with pytest.raises(ValueError, match="lacks column"):
        ATTENTION.bytes(rows(PREFILL).drop(columns="heads"))
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        ATTENTION.bytes(rows((1, 8, 8, 6, 4, 64, True)))


@pytest.fixture(scope="module")
def table(mixed_dir):
    from nslib.data.mixed_data import attention_table
    t = attention_table(mixed_dir)
    return t.groupby("gpu", group_keys=False).sample(1500, random_state=0).reset_index(drop=True)


@pytest.fixture(scope="module")
def trained(table):
    return TensorAttention(quick=True).fit(table, progress=False)


def test_never_below_floor_and_save_load(trained, table, tmp_path):
    pred = trained.predict(table)
    assert np.isfinite(pred).all()
    assert (pred >= floor_ms(table) * (1 - 1e-12)).all()
    path = trained.save(tmp_path / "attention.npz")
    again = predictor_class("nslib", "attention").load(path)
    np.testing.assert_array_equal(again.predict(table), pred)


def test_more_queries_or_keys_never_cost_less(trained, table):
    # each phase has its own MLP: a prefill row must still cost at least the one-query kernel
    # over the same keys, and every row at least one query over one key (same batch, heads)
    pred = trained.predict(table)
    pre = (table["q_len"] > 1).to_numpy()
    assert pre.any() and (~pre).any()
    one_query = trained.predict(table[pre].assign(q_len=1))
    assert (pred[pre] >= one_query).all()
    assert (pred >= trained.predict(table.assign(q_len=1, kv_len=1))).all()
    prefill_only = TensorAttention(quick=True).fit(table[pre].reset_index(drop=True),
                                                   progress=False)
    assert np.isfinite(prefill_only.predict(table[pre])).all()


def test_faster_gpu_scales_big_prefill(trained, table):
    big = table[table["phase"] == "prefill"].nlargest(5, "latency_ms")
    base = trained.predict(big)
    for k in (2.0, 4.0):
        fast = big.assign(bf16_gflops=big["bf16_gflops"] * k, mem_bw=big["mem_bw"] * k)
        ratio = base / trained.predict(fast)
        assert (ratio > 0.8 * k).all() and (ratio < 1.25 * k).all(), ratio


def test_quick_logo_finite_per_gpu(table):
    from nslib.evaluation.kernel_level import logo_over, mape_table

    def fit_without(held):   # a fresh quick fit per fold, in place of the cached folds
        return TensorAttention(quick=True).fit(
            table[~table["gpu"].isin([held])].reset_index(drop=True), progress=False)
    held_out = ((g, fit_without(g)) for g in table["gpu"].unique())
    mape = mape_table(table.assign(pred_q=logo_over(table, held_out)))["q"]
    assert len(mape) == table["gpu"].nunique() and np.isfinite(mape).all()
    assert (mape < 100).all(), mape


def test_gpu_weights_make_each_gpu_weigh_the_same():
    frame = pd.DataFrame({"gpu": ["a"] * 3 + ["b"]})
    w = TensorAttention()._row_weights(frame)
    # 4 rows, 2 GPUs: each GPU totals 2 (mean 1); a's 3 rows share it, b's one row holds it all
    np.testing.assert_allclose(w, [2 / 3, 2 / 3, 2 / 3, 2.0])
    assert TensorAttention(gpu_weights=False)._row_weights(frame) is None
