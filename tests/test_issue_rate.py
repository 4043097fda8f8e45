"""nslib.kernels.issue_rate: what an SM can issue as FFMAs, against hand arithmetic."""
import numpy as np
import pandas as pd
import pytest

from nslib.data.gpus import GPU
from nslib.data.settings import Settings
from nslib.kernels import clock, issue_rate, sizes

# 132 SMs of 128 lanes at 1.98 GHz (an H100-like datasheet) and its 64-lane twin
WIDE = GPU(name="Wide", mem_gb=80, mem_bw=3350, num_sm=132, cores_per_sm=128, clock_mhz=1980,
           peak_gflops=2 * 132 * 128 * 1.98, l2_mb=50)
NARROW = GPU(name="Narrow", mem_gb=80, mem_bw=3350, num_sm=132, cores_per_sm=64,
             clock_mhz=1980, peak_gflops=2 * 132 * 64 * 1.98, l2_mb=50)


def frame_of(rows, gpu):
    df = pd.DataFrame(rows)
    for c in ("B", "M", "N", "K", "H"):
        df[c] = df.get(c, np.nan)
    return df.assign(**clock.frame_columns(gpu))


ROWS = [{"cls": "linear", "op": "linear", "B": 1, "M": 8192, "N": 8192, "K": 8192},
        {"cls": "bmm", "op": "bmm", "B": 64, "M": 1024, "N": 64, "K": 1024},
        {"cls": "elementwise", "op": "add", "B": 1024, "H": 4096}]


def test_a_wide_sm_issues_64_of_69_of_its_lanes_to_a_gemm():
    f = issue_rate.bounded(frame_of(ROWS, WIDE))
    expect = 64 / 69 * 2 * 128 * 132 * 1980 / 1000      # GFLOP/s
    assert f["peak_gflops"].tolist()[:2] == pytest.approx([expect, expect])
    assert f["peak_gflops"].iat[2] == WIDE.peak_gflops   # not a GEMM: the datasheet peak


def test_a_narrow_sm_and_a_frame_without_clock_keep_the_peak():
    f = frame_of(ROWS, NARROW)
    assert issue_rate.bounded(f)["peak_gflops"].tolist() == f["peak_gflops"].tolist()
    g = frame_of(ROWS, WIDE).drop(columns="clock_mhz")
    assert issue_rate.bounded(g) is g


def test_the_bound_follows_the_clock_and_sms_not_the_lanes():
    # twice the clock or the SMs: twice the issue rate, so a wide GPU's GEMM peak doubles
    wide = issue_rate.bounded(frame_of(ROWS, WIDE))["peak_gflops"].to_numpy()
    for change in ({"clock_mhz": 2 * WIDE.clock_mhz}, {"num_sm": 2 * WIDE.num_sm}):
        more = frame_of(ROWS, WIDE).assign(peak_gflops=2 * WIDE.peak_gflops, **change)
        assert issue_rate.bounded(more)["peak_gflops"].to_numpy()[:2] == pytest.approx(
            2 * wide[:2])
    # the narrow twin at the same clock issues the same: its (lower) peak is below the bound
    narrow = issue_rate.bounded(frame_of(ROWS, NARROW))["peak_gflops"].to_numpy()
    assert (narrow[:2] == NARROW.peak_gflops).all() and (narrow[:2] < wide[:2]).all()


def test_nslib_prices_a_wide_gpus_big_gemm_at_the_issue_rate(data_dir):
    from nslib.predictors import trained
    pred = trained("nslib", Settings(progress=False))
    f = frame_of(ROWS[:1], WIDE)
    with_clock, without = pred.predict(f)[0], pred.predict(f.drop(columns="clock_mhz"))[0]
    # compute-bound: the time grows by the peak over the issue rate, 69/64 (within the
    # law's fixed cost)
    assert with_clock / without == pytest.approx(69 / 64, rel=0.02)
    assert with_clock >= sizes.roofline_ms(f)[0]


def test_frames_built_from_a_datasheet_or_a_table_carry_the_clock():
    from nslib.model.inputs import kernel_frame
    trace = pd.DataFrame([{**ROWS[0], "H": np.nan}])
    assert kernel_frame(trace, WIDE)["clock_mhz"].tolist() == [WIDE.clock_mhz]
    table = pd.DataFrame({"gpu": ["Wide", "Narrow", "Wide"]})
    assert clock.with_clock(table, {"w": WIDE, "n": NARROW})["clock_mhz"].tolist() == [
        1980.0, 1980.0, 1980.0]
    with pytest.raises(ValueError, match="no datasheet for 'Other'"):
        clock.with_clock(pd.DataFrame({"gpu": ["Other"]}), {"w": WIDE})

