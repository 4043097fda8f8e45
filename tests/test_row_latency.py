"""nslib.kernels.row_latency: a layer norm's round-trip bound, against hand arithmetic."""
import numpy as np
import pandas as pd
import pytest

from nslib.data.gpus import GPU
from nslib.kernels import clock, row_latency, sizes
from nslib.model.stream import stream_ms

A100 = GPU(name="Test A100", mem_gb=40, mem_bw=1555, num_sm=108, cores_per_sm=64,
           clock_mhz=1410, peak_gflops=19500, l2_mb=40)


def frame_of(rows, gpu=A100):
    df = pd.DataFrame(rows)
    for c in ("B", "M", "N", "K", "H"):
        df[c] = df.get(c, np.nan)
    return df.assign(**clock.frame_columns(gpu))


def test_sixteen_long_rows_take_two_sweeps_of_round_trips():
    df = frame_of([{"cls": "layernorm", "op": "ln", "B": 16, "H": 4 * 2 ** 20},
                   {"cls": "layernorm", "op": "ln", "B": 2, "H": 500},
                   {"cls": "elementwise", "op": "add", "B": 16, "H": 4 * 2 ** 20},
                   {"cls": "layernorm", "op": "ln_bw", "B": 16, "H": 4 * 2 ** 20}])
    out = row_latency.floor_ms(df)
    # 4M elements / (128 threads x 4) = 8192 steps per sweep, two sweeps, 890 cycles each
    assert out[0] == pytest.approx(2 * 8192 * 890 / 1410e6 * 1e3)
    assert out[1] == pytest.approx(2 * 1 * 890 / 1410e6 * 1e3)   # one step per sweep
    assert out[2] == 0 and out[3] == 0                           # other kernels: no bound
    # 108 SMs hold 108 x 16 blocks of 128 threads at once: one more block is a second round
    rounds = row_latency.floor_ms(frame_of([{"cls": "layernorm", "op": "ln", "B": b, "H": 512}
                                            for b in (1728, 1729)]))
    assert rounds[1] == pytest.approx(2 * rounds[0])
    # the bound is far above this kernel's roofline (30x): bandwidth alone does not see it
    assert out[0] > 25 * sizes.roofline_ms(df)[0]


def test_more_sms_or_clock_never_make_the_bound_longer():
    rows = [{"cls": "layernorm", "op": "ln", "B": b, "H": h}
            for b in (1, 16, 200, 5000, 100000) for h in (64, 1000, 4096, 10 ** 6)]
    base = row_latency.floor_ms(frame_of(rows))
    for change in ({"num_sm": 2 * A100.num_sm}, {"clock_mhz": 2 * A100.clock_mhz}):
        more = row_latency.floor_ms(frame_of(rows).assign(**change))
        assert (more <= base + 1e-12).all()


def test_a_frame_without_the_clock_is_a_clear_error():
    df = frame_of([{"cls": "layernorm", "op": "ln", "B": 16, "H": 4096}]).drop(
        columns="clock_mhz")
    with pytest.raises(ValueError, match="clock_mhz.*frame_columns"):
        row_latency.floor_ms(df)
    # frames without a layer norm need no clock
    assert row_latency.floor_ms(df.assign(op="add", cls="elementwise")).tolist() == [0.0]


class Bandwidth:
    """A predictor that prices every kernel at its roofline, no floor."""

    def __init__(self, library_sizing=True):
        self.library_sizing = library_sizing

    def predict(self, frame):
        return sizes.roofline_ms(frame)


def test_the_stream_keeps_the_bound_for_library_sized_predictors_only(monkeypatch):
    import nslib.model.stream as stream
    monkeypatch.setattr(stream, "_floor_parts",
                        lambda pred, frame, data=None: (np.zeros(len(frame)), np.ones(len(frame)),
                                                           0.0))
    df = frame_of([{"cls": "layernorm", "op": "ln", "B": 16, "H": 4 * 2 ** 20}])
    bound = row_latency.floor_ms(df)[0]
    assert stream_ms(Bandwidth(True), df, launch_us=0.0)[0] == pytest.approx(bound)
    assert stream_ms(Bandwidth(False), df, launch_us=0.0)[0] == pytest.approx(
        sizes.roofline_ms(df)[0])


def test_a_traced_group_norm_sweeps_its_rows_once():
    rows = [{"cls": "layernorm", "op": "ln", "B": 16, "H": 2 ** 20, "aten": a}
            for a in ("aten.native_layer_norm.default", "aten.native_group_norm.default")]
    ln, gn = row_latency.floor_ms(frame_of(rows))
    assert gn == pytest.approx(ln / 2)
