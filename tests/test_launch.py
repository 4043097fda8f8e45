"""nslib.model.stream: microbenchmark latencies to in-stream latencies, against hand arithmetic."""
import numpy as np
import pandas as pd
import pytest

from nslib.data.gpus import GPU
from nslib.kernels import sizes
from nslib.model.inputs import kernel_frame
from nslib.model.predict import predict_model
from nslib.model.stream import (floors, host_bound, host_dispatch_ms, probe_kernels, step_ms,
                                stream_ms, stream_terms)
from nslib.model.step import Step

GPU0 = GPU(name="Test GPU", mem_gb=80, mem_bw=1000, num_sm=100, cores_per_sm=128,
           clock_mhz=1500, peak_gflops=10000, l2_mb=50)


class Floor:
    """A predictor with a 25 us dispatch floor: 0.025 ms plus 1 ms per 100 GFLOP and per GB."""

    def predict(self, frame):
        f, b = sizes.flops_bytes(frame)
        return 0.025 + f / 1e11 + b / 1e9


def frame_of(rows):
    df = pd.DataFrame(rows)
    for c in ("B", "M", "N", "K", "H"):
        df[c] = df.get(c, np.nan)
    for k, v in GPU0.columns().items():
        df[k] = v
    return df


def test_probes_are_the_smallest_training_kernels(data_dir):
    from nslib.kernels import measured
    probe = probe_kernels()
    assert set(probe["cls"]) == set(sizes.CLASSES)
    f, b = sizes.flops_bytes(probe)
    for cls, size in zip(probe["cls"], f + b):
        tab = measured.kernel_table(cls, "train")
        assert size == (tab["flops"].fillna(0) + tab["bytes"].fillna(0)).min()
    # ratios: the class's smallest kernel against the smallest elementwise one, same GPU
    r = probe.set_index("cls")["ratio"]
    assert r["elementwise"] == 1.0 and r["linear"] > 1.0 and (r > 0.5).all() and (r < 5).all()


def test_stream_takes_the_floor_off_and_keeps_the_roofline(data_dir):
    df = frame_of([
        {"cls": "elementwise", "op": "add", "B": 1, "H": 1e3},             # tiny: launch gap
        {"cls": "elementwise", "op": "add", "B": 1e4, "H": 1e4},           # 1.2 GB
        {"cls": "linear", "op": "linear", "B": 1, "M": 4096, "N": 4096, "K": 4096}])
    pred = Floor()
    fl = floors(pred, df)
    probe = probe_kernels().set_index("cls")
    ew = pred.predict(frame_of([probe.loc["elementwise", ["op", "B", "H"]].to_dict()
                                | {"cls": "elementwise"}]))[0]
    assert fl == pytest.approx([ew, ew, ew * probe.loc["linear", "ratio"]])
    raw = pred.predict(df)
    out = stream_ms(pred, df, launch_us=3.0)
    assert out[0] == pytest.approx(0.003)                       # floor off: the launch gap
    assert out[1] == pytest.approx(max(raw[1] - fl[1], sizes.roofline_ms(df)[1]))
    # the GEMM's 100 TFLOP/s is faster than the GPU's 10 TFLOP/s roofline: the bound wins
    assert out[2] == pytest.approx(sizes.roofline_ms(df)[2])
    assert stream_ms(pred, df, launch_us=None) == pytest.approx(raw)
    with pytest.raises(ValueError, match="launch_us"):
        stream_ms(pred, df, launch_us=-1)


def test_another_hosts_floor_replaces_the_probe_and_keeps_the_class_ratios(data_dir):
    # a harness on another machine: each operator call costs that host's measured one-op
    # floor times the class ratio; the GPU time still takes the predictor's own floor off
    df = frame_of([
        {"cls": "elementwise", "op": "add", "B": 1, "H": 1e3, "phase": "fw", "call": 0},
        {"cls": "linear", "op": "linear", "B": 1, "M": 8, "N": 8, "K": 8, "phase": "fw",
         "call": 1},
        {"cls": "elementwise", "op": "add", "B": 1, "H": 1e3, "phase": "fw", "call": 1}])
    pred = Floor()
    ratio = probe_kernels().set_index("cls")["ratio"]
    host = floors(pred, df, host_floor_ms=0.004)
    assert host == pytest.approx([0.004, 0.004 * ratio["linear"], 0.004])
    own = stream_terms(pred, df, 3.0)
    other = stream_terms(pred, df, 3.0, host_floor_ms=0.004)
    assert other[1] == pytest.approx(own[1]) and other[2] == pytest.approx(host)
    # tiny kernels: all host; the call's second kernel costs a launch, not a dispatch
    step = step_ms(pred, df, 3.0, per_call=True, host_floor_ms=0.004).sum()
    assert step == pytest.approx(0.004 + 0.004 * ratio["linear"] + 0.003)


def test_model_prediction_in_stream_is_below_the_plain_sum(data_dir):
    cfg = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100,
           "n_positions": 64, "architectures": ["GPT2LMHeadModel"]}
    frame, s = predict_model(GPU0, cfg, Step(2, 16, "train"), Floor())
    _, plain = predict_model(GPU0, cfg, Step(2, 16, "train"), Floor(), launch_us=None)
    assert s["launch_us"] == 3.0 and plain["launch_us"] is None
    # every kernel of this tiny model takes the GPU the launch gap, but the host needs its
    # dispatch to issue each: the step is host-bound and costs the dispatches' sum, each the
    # measurement hosts' (~38 us, more than this predictor's 25 us floor) capped at the
    # kernel's whole latency, so here every kernel's whole latency
    fl = stream_terms(Floor(), frame)[2]
    assert s["e2e_ms"] == pytest.approx(fl.sum())
    assert (fl > 0.003).all() and (fl <= Floor().predict(frame)).all()
    # the classes keep their GPU-time shares: in each phase every kernel is stretched alike
    for phase in ("fw", "bw"):
        m = (frame["phase"] == phase).to_numpy()
        assert frame["pred_ms"].to_numpy()[m] == pytest.approx(np.full(m.sum(),
                                                                       fl[m].sum() / m.sum()))
    assert plain["e2e_ms"] >= s["e2e_ms"]
    kf = kernel_frame(frame, GPU0)
    assert len(kf) == len(frame)


class SlowFloor(Floor):
    """:class:`Floor` with a 60 us dispatch floor (a host slower than the measurement hosts')."""

    def predict(self, frame):
        return super().predict(frame) + 0.035


def test_the_host_dispatch_is_the_measurement_hosts(data_dir):
    # the host's one-op dispatch is the median over the training GPUs of the smallest
    # elementwise kernel's measured latency, whatever the predictor prices that kernel at
    from nslib.kernels import measured
    from nslib.model.stream import _PROBE_COLS
    probe = probe_kernels()
    tab = measured.kernel_table("elementwise", "train")
    row = probe[probe["cls"] == "elementwise"][_PROBE_COLS]
    same = tab[_PROBE_COLS].merge(row, how="left", indicator=True)["_merge"] == "both"
    per_gpu = tab[same.to_numpy()].groupby("gpu")["latency_ms"].median()
    assert host_dispatch_ms(Floor()) == pytest.approx(per_gpu.median())
    assert 0.02 < host_dispatch_ms(SlowFloor()) == host_dispatch_ms(Floor()) < 0.06
    # a fold's predictor: the median over the GPUs it was trained on
    fold = SlowFloor()
    fold.excluded_gpus = (per_gpu.index[0],)
    assert host_dispatch_ms(fold) == pytest.approx(per_gpu.iloc[1:].median())
    # the dispatch is that times the class ratio; the GPU time still takes the predictor's
    # own (60 us) floor off
    df = frame_of([{"cls": "elementwise", "op": "add", "B": 1, "H": 1e3},
                   {"cls": "linear", "op": "linear", "B": 1, "M": 8, "N": 8, "K": 8}])
    ratio = probe.set_index("cls")["ratio"]
    raw, gpu_ms, dispatch = stream_terms(SlowFloor(), df, 3.0)
    # (capped at the kernel's whole latency: the linear op's 1.8 dispatches exceed 60 us)
    assert dispatch == pytest.approx(np.minimum(host_dispatch_ms(Floor()) * np.array(
        [1.0, ratio["linear"]]), raw))
    assert dispatch[0] < raw[0]
    assert gpu_ms == pytest.approx([0.003, 0.003])   # the floors off: the launch gap


def test_host_bound_by_hand():
    """Per phase: GPU time when it exceeds the dispatches, else the dispatches' sum, each
    kernel stretched in proportion to its GPU time."""
    frame = pd.DataFrame({"phase": ["fw", "fw", "bw", "bw"]})
    gpu = np.array([0.010, 0.030, 0.500, 0.100])
    host = np.array([0.025, 0.025, 0.025, 0.025])
    out = host_bound(frame, gpu, host)
    assert out[:2] == pytest.approx([0.0125, 0.0375])   # fw: 40 us of GPU, 50 us of dispatch
    assert out[2:] == pytest.approx(gpu[2:])            # bw: GPU-bound, unchanged
    assert host_bound(frame.iloc[:0], gpu[:0], host[:0]).size == 0



def test_stream_terms_reuse_a_prediction(data_dir):
    df = frame_of([{"cls": "elementwise", "op": "add", "B": 1e4, "H": 1e4},
                   {"cls": "linear", "op": "linear", "B": 1, "M": 512, "N": 512, "K": 512}])
    pred = Floor()
    fresh = stream_terms(pred, df)
    given = stream_terms(pred, df, raw=pred.predict(df))
    for a, b in zip(fresh, given):
        assert a == pytest.approx(b)


def test_a_method_as_published_prices_memory_operators_at_bytes_over_bandwidth():
    # method.md section 2: memory ops (copies, gathers, masks) cost bytes / bandwidth in
    # NeuSight as published (a plain_sum predictor); nslib's design prices them as copies
    class Published(Floor):
        plain_sum = True

    trace = pd.DataFrame([
        {"cls": "memory", "op": "copy", "B": 1, "H": 1e6, "bytes": 8e6},
        {"cls": "elementwise", "op": "add", "B": 1, "H": 1e6, "bytes": 1.2e7}])
    trace[["M", "N", "K"]] = np.nan
    frame = kernel_frame(trace, GPU0)
    copy = Floor().predict(frame)
    raw, gpu_ms, dispatch = stream_terms(Published(), frame, launch_us=3.0)
    assert raw[0] == pytest.approx(8e6 / (1000 * 1e9) * 1e3)    # 8 MB at 1000 GB/s: 8 us
    assert raw[1] == pytest.approx(copy[1]) and gpu_ms == pytest.approx(raw)
    assert (dispatch == 0).all()
    assert stream_terms(Floor(), frame, launch_us=None)[0] == pytest.approx(copy)
