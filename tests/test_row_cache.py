"""The long-softmax-row law (nslib.kernels.row_cache), checked by hand."""
import numpy as np
import pandas as pd
import pytest

from nslib.kernels import row_cache


def _rows(H, B, num_sm=80.0, l2_mb=6.0, op="softmax"):
    return pd.DataFrame({"op": [op], "cls": ["softmax"], "B": [float(B)], "H": [float(H)],
                         "num_sm": [num_sm], "l2_mb": [l2_mb],
                         "bytes": [2.0 * 4 * B * H]})


@pytest.mark.parametrize("H, threads", [(1280, 256), (2048, 256), (2560, 512), (4096, 512),
                                        (16384, 512), (1025, 256), (100, 32)])
def test_block_threads_follow_pytorch_rule(H, threads):
    # the power of two at least min(H / 4, 1024) / 2, at least one warp
    assert row_cache.block_threads([H])[0] == threads


def test_rows_that_fit_the_l2_are_read_once():
    # 80 SMs x (2048 / 256 = 8 blocks) x 2048 floats x 4 B = 5 MiB in flight, under 6 MiB
    f = _rows(2048, 65536)
    assert row_cache.miss_share(f)[0] == 0.0
    assert row_cache.dram_bytes(f)[0] == f["bytes"].iat[0]


def test_rows_that_overflow_the_l2_by_hand():
    # 16384 floats: 512 threads, 4 blocks an SM; 80 x 4 rows of 64 KiB = 20 MiB in flight,
    # a 6 MiB L2 keeps 6 / 20 of them: 0.7 of the two repeated reads go to DRAM
    f = _rows(16384, 65536)
    assert row_cache.miss_share(f)[0] == pytest.approx(0.7)
    # one read and one write, plus 0.7 of two more reads: (2 + 1.4) / 2 of the bytes
    assert row_cache.dram_bytes(f)[0] == pytest.approx(f["bytes"].iat[0] * 1.7)


def test_few_rows_fit_whatever_their_length():
    # 16 rows of 64 KiB are 1 MiB in flight, however many SMs there are
    assert row_cache.miss_share(_rows(16384, 16))[0] == 0.0


def test_warp_rows_other_ops_and_missing_l2_are_untouched():
    assert row_cache.miss_share(_rows(1024, 10**6, l2_mb=0.01))[0] == 0.0   # warp softmax
    assert row_cache.miss_share(_rows(16384, 10**6, op="softmax_bw"))[0] == 0.0
    assert row_cache.miss_share(_rows(16384, 10**6, l2_mb=np.nan))[0] == 0.0
    f = _rows(2048, 65536).assign(cls="elementwise", op="add")
    assert row_cache.with_rereads(f) is f


def test_more_l2_never_adds_bytes_and_more_sms_sharing_one_l2_can():
    f = _rows(8192, 10**5)
    sizes = [row_cache.dram_bytes(f.assign(l2_mb=m))[0] for m in (1.0, 2.0, 4.0, 8.0, 64.0)]
    assert all(a >= b for a, b in zip(sizes, sizes[1:])) and sizes[-1] == f["bytes"].iat[0]
    # the same L2 shared by twice the SMs holds half the share of their rows
    assert row_cache.miss_share(f.assign(num_sm=160.0))[0] > row_cache.miss_share(f)[0]
    # SMs that bring their share of the L2 change nothing
    assert row_cache.miss_share(f.assign(num_sm=160.0, l2_mb=12.0))[0] == \
        pytest.approx(row_cache.miss_share(f)[0])
