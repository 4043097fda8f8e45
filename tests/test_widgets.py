"""The GPU explorer (nslib.explore): hypothetical GPUs, pasted configs, scenarios, range
warnings, and the ipywidgets UI driven without a browser (quick NeuSight predictor)."""
import json

import numpy as np
import pandas as pd
import pytest

from nslib.data.gpus import GPU, find_gpu, gpu_from_dict, load_gpus
from nslib.data.settings import Settings
from nslib.explore.gpus import explorer_gpus, hypothetical_gpu
from nslib.explore.pasted import parse_pasted_config
from nslib.explore.ranges import explorer_ranges
from nslib.explore.ui import build_explorer
from nslib.explore.whatif import dominance_warnings, largest_kernels, scenario
from nslib.kernels import measured, sizes
from nslib.model.step import Step

# a small GPT-2 that traces in well under a second
QUICK = Settings(quick=True)   # the quick-trained predictors
TINY = {"model_type": "gpt2", "n_layer": 2, "n_embd": 256, "n_head": 4, "n_positions": 1024,
        "vocab_size": 1000}


@pytest.fixture(scope="module")
def gpus(data_dir):
    return load_gpus()


@pytest.fixture(scope="module")
def base(gpus):
    return find_gpu("A100-PCIE-40GB", gpus)     # a training GPU: in range by definition


@pytest.fixture(scope="module")
def neusight(data_dir):
    from nslib.model.inputs import get_predictor
    return get_predictor("nslib", quick=True)


# ----- hypothetical GPUs

def test_hypothetical_gpu_changes_only_what_is_asked(base):
    g = hypothetical_gpu(base, mem_bw=base.mem_bw * 2)
    assert isinstance(g, GPU) and g.mem_bw == 2 * base.mem_bw
    for f in ("num_sm", "peak_gflops", "mem_gb", "l2_mb", "cores_per_sm", "clock_mhz"):
        assert getattr(g, f) == getattr(base, f)
    assert "mem_bw x2" in g.name and g.name != base.name
    assert base.mem_bw == 1555                      # the base GPU is untouched (frozen)
    assert gpu_from_dict(g.to_json()) == g           # a valid datasheet, round-trips
    named = hypothetical_gpu(base, name="My GPU", num_sm=np.int64(216), l2_mb=np.float64(80))
    assert named.name == "My GPU" and named.num_sm == 216 and named.l2_mb == 80
    assert hypothetical_gpu(base, num_sm=216.0).num_sm == 216


def test_a_hypothetical_gpus_clock_follows_its_peak(base):
    # peak = 2 x SMs x lanes x clock: twice the peak on the same SMs is twice the clock
    fast = hypothetical_gpu(base, peak_gflops=base.peak_gflops * 2)
    assert fast.clock_mhz == pytest.approx(2 * base.clock_mhz)
    assert "clock" not in fast.name and "peak_gflops x2" in fast.name
    wide = hypothetical_gpu(base, peak_gflops=base.peak_gflops * 2, cores_per_sm=128)
    assert wide.clock_mhz == pytest.approx(base.clock_mhz * 2 / (128 / base.cores_per_sm))
    assert hypothetical_gpu(base, peak_gflops=base.peak_gflops * 2,
                            clock_mhz=900).clock_mhz == 900          # given: kept
    assert hypothetical_gpu(base, mem_bw=base.mem_bw * 2).clock_mhz == base.clock_mhz


@pytest.mark.parametrize("overrides, match", [
    ({"mem_bw": 0}, "Mem_Bw"), ({"peak_gflops": -5.0}, "SingleFLOPs"),
    ({"l2_mb": "big"}, "L2Cache"), ({"num_sm": 1.5}, "whole number"),
    ({"tensor_cores": 4}, "unknown GPU field"),
])
def test_hypothetical_gpu_is_validated_like_a_datasheet(base, overrides, match):
    with pytest.raises(ValueError, match=match):
        hypothetical_gpu(base, **overrides)


def test_hypothetical_gpu_needs_a_gpu():
    with pytest.raises(TypeError):
        hypothetical_gpu({"Device": "x"}, mem_bw=1)


# ----- twice the bandwidth never makes a memory-bound kernel slower

def _vector_kernels():
    """Elementwise, softmax and layernorm kernels: the sizes measured in the test split (a
    single GPU's rows) plus a grid of small ones, where launch costs dominate."""
    frames = []
    for cls in ("elementwise", "softmax", "layernorm"):
        t = measured.kernel_table(cls, "test")
        frames.append(t[t["gpu"] == t["gpu"].iloc[0]][["cls", "op", "B", "H"]])
    grid = pd.DataFrame([{"op": op, "B": float(b), "H": float(h)}
                         for op in ("add", "addu", "mul", "gelu", "tanh", "softmax", "ln")
                         for b in (1, 16, 256, 4096, 16384) for h in (64, 1024, 4096)])
    grid["cls"] = sizes.op_class(grid["op"])
    df = pd.concat(frames + [grid], ignore_index=True).drop_duplicates(ignore_index=True)
    for c in ("M", "N", "K"):
        df[c] = np.nan
    return df


def _on(frame, gpu):
    return frame.assign(**{k: v for k, v in gpu.columns().items() if k != "gpu"}, gpu=gpu.name)


@pytest.mark.parametrize("name", ["NVIDIA A100-PCIE-40GB", "NVIDIA H100 80GB HBM3", "Tesla P4"])
def test_twice_the_bandwidth_never_slows_a_memory_bound_kernel(gpus, neusight, name):
    g = find_gpu(name, gpus)
    fast = hypothetical_gpu(g, mem_bw=2 * g.mem_bw)
    ks = _vector_kernels()
    f1, f2 = _on(ks, g), _on(ks, fast)
    flops, nbytes = sizes.flops_bytes(f1)
    memory_bound = flops / nbytes < g.peak_gflops / g.mem_bw
    assert memory_bound.all()                 # every vector kernel is, on every GPU here
    p1, p2 = neusight.predict(f1), neusight.predict(f2)
    ratio = p2 / p1
    slower = memory_bound & (ratio > 1 + 1e-9)
    worst = int(np.argmax(ratio))
    assert not slower.any(), (
        f"{int(slower.sum())} of {len(ks)} memory-bound kernels are predicted slower on "
        f"{fast.name} than on {name}; worst: {ks.iloc[worst][['op', 'B', 'H']].to_dict()} "
        f"{p1[worst]:.4f} ms -> {p2[worst]:.4f} ms (x{ratio[worst]:.2f}); by class: "
        f"{ks[slower].groupby('cls').size().to_dict()}")


@pytest.mark.parametrize("name", ["NVIDIA A100-PCIE-40GB", "NVIDIA H100 80GB HBM3"])
def test_twice_the_fp32_peak_never_slows_a_kernel(gpus, neusight, name):
    """The explorer's peak slider: more FLOP/s can never make a kernel slower (for a
    memory-bound one it should change next to nothing)."""
    g = find_gpu(name, gpus)
    fast = hypothetical_gpu(g, peak_gflops=2 * g.peak_gflops)
    ks = _vector_kernels()
    p1, p2 = neusight.predict(_on(ks, g)), neusight.predict(_on(ks, fast))
    ratio = p2 / p1
    slower = ratio > 1 + 1e-9
    assert not slower.any(), (
        f"{int(slower.sum())} of {len(ks)} kernels are predicted slower on {fast.name} than on "
        f"{name} (median x{np.median(ratio[slower]):.2f}, max x{ratio.max():.2f}); by class: "
        f"{ks[slower].groupby('cls').size().to_dict()}")


def test_dominance_warning_flags_a_better_gpu_predicted_slower(base):
    better = hypothetical_gpu(base, name="better", mem_bw=2 * base.mem_bw)
    assert dominance_warnings([base, better], ["base", "better"], [10.0, 9.0]) == []
    hit = dominance_warnings([base, better], ["base", "better"], [10.0, 12.0])
    assert len(hit) == 1 and hit[0].startswith("better has at least the datasheet of base")
    # a different SM count is not comparable (waves change), and neither dominates here
    other = hypothetical_gpu(base, name="other", num_sm=2 * base.num_sm, mem_bw=3000)
    assert dominance_warnings([base, other], ["base", "other"], [10.0, 12.0]) == []


def test_twice_the_bandwidth_never_slows_a_model(gpus):
    h = find_gpu("H100", gpus)
    res = scenario([h, hypothetical_gpu(h, mem_bw=2 * h.mem_bw)], TINY, Step(4, 512, "inf"),
                   settings=QUICK)
    s = res["summary"].set_index("gpu")
    assert s["e2e_ms"].iloc[1] <= s["e2e_ms"].iloc[0]
    assert res["per_class"]["elementwise"].iloc[1] <= res["per_class"]["elementwise"].iloc[0]


# ----- scenarios and warnings

def test_scenario_frames_and_units(gpus, base):
    res = scenario(["H100", base], TINY, Step(2, 256, "train"), top=5, settings=QUICK)
    s = res["summary"]
    assert list(s["gpu"]) == ["NVIDIA H100 80GB HBM3", base.name]
    assert np.allclose(s["e2e_ms"], s["fw_ms"] + s["bw_ms"]) and (s["bw_ms"] > 0).all()
    assert np.allclose(res["per_class"].sum(axis=1).to_numpy(), s["e2e_ms"].to_numpy())
    assert list(s["in_training_range"]) == [False, True]
    top = res["top_kernels"]
    assert set(top["gpu"]) == set(s["gpu"]) and top.groupby("gpu").size().max() <= 5
    gemm = top[top["kernel_class"].isin(["linear", "bmm"])]
    assert len(gemm) and (gemm["intensity"] > 0).all()
    # the roofline placement never sits above the roof (predictions are bounded)
    assert (gemm["achieved_gflops"] <= gemm["roofline_gflops"] * (1 + 1e-9)).all()
    # sorted by total time, and the totals add up to at most the step
    for g, sub in top.groupby("gpu"):
        assert sub["total_ms"].is_monotonic_decreasing
        assert sub["total_ms"].sum() <= s.set_index("gpu").loc[g, "e2e_ms"] * (1 + 1e-9)


def test_in_range_gpu_has_no_gpu_warning_and_10x_peak_has_one(base):
    ok = scenario([base], TINY, Step(2, 128, "inf"), settings=QUICK)
    assert not [w for w in ok["warnings"] if "outside the training GPUs" in w]
    fast = hypothetical_gpu(base, peak_gflops=10 * base.peak_gflops)
    res = scenario([fast], TINY, Step(2, 128, "inf"), settings=QUICK)
    # one line for the scenario, the figures as details (folded in the explorer)
    hit = [w for w in res["warnings"] if "outside the training GPUs" in w]
    assert len(hit) == 1 and "10x" in hit[0]
    assert res["range_details"] == [
        f"{fast.name}: SingleFLOPs 194,920 GFLOP/s is 10x the largest training GPU's "
        f"(19,492 GFLOP/s)",
        f"{fast.name}: FLOP/byte 125 FLOP/B is 4.2x the largest training GPU's (29.7 FLOP/B)"]
    assert not res["summary"]["in_training_range"].iloc[0]
    # bandwidth, SMs and L2 beyond the range are named too
    odd = hypothetical_gpu(base, mem_bw=10 * base.mem_bw, num_sm=1000, l2_mb=0.5)
    res = scenario([odd, base], TINY, Step(2, 128, "inf"), settings=QUICK)
    text = " ".join(res["range_details"])
    assert "Mem_Bw" in text and "Num_Sm" in text and "L2Cache 0.5 MB is 4x below" in text
    assert len([w for w in res["warnings"] if "outside the training GPUs" in w]) == 1


def test_kernels_larger_than_any_training_kernel_are_warned_about(base):
    r = explorer_ranges()
    assert r["dims"]["softmax"]["B"][1] < 64 * 4 * 512      # softmax rows = batch x heads x seq
    res = scenario([base], TINY, Step(64, 512, "inf"), settings=QUICK)
    assert any("softmax kernels are outside the training kernels' sizes" in w
               for w in res["warnings"])
    assert any("more waves than any training" in w for w in res["warnings"])


def test_fused_reaches_predict_model(base):
    plain = scenario([base], TINY, Step(1, 64, "inf"), settings=QUICK)
    fused = scenario([base], TINY, Step(1, 64, "inf", fused=True), settings=QUICK)
    assert fused["summary"]["n_kernels"].iloc[0] < plain["summary"]["n_kernels"].iloc[0]


def test_scenario_rejects_bad_requests(base):
    with pytest.raises(ValueError, match="mode"):
        scenario([base], TINY, Step(1, 64, "serve"), settings=QUICK)
    with pytest.raises(ValueError, match="batch"):
        scenario([base], TINY, Step(0, 64, "inf"), settings=QUICK)
    with pytest.raises(ValueError, match="no GPU"):
        scenario([], TINY, Step(1, 64, "inf"), settings=QUICK)
    with pytest.raises(KeyError):
        scenario(["not a gpu"], TINY, Step(1, 64, "inf"), settings=QUICK)


def test_largest_kernels_groups_identical_launches(base):
    f = pd.DataFrame({"phase": "fw", "kernel_class": ["linear", "linear", "elementwise"],
                      "cls": ["linear", "linear", "elementwise"], "op": ["linear", "linear", "add"],
                      "B": [1.0, 1.0, 4.0], "M": [64.0, 64.0, np.nan], "N": [64.0, 64.0, np.nan],
                      "K": [64.0, 64.0, np.nan], "H": [np.nan, np.nan, 8.0],
                      "flops": [2 * 64.0 ** 3] * 2 + [32.0],
                      "bytes": [4 * 3 * 64.0 ** 2] * 2 + [384.0],
                      "pred_ms": [0.01, 0.01, 0.005]})
    top = largest_kernels(f, "x", base, 0.025, top=10)
    assert list(top["count"]) == [2, 1] and top["total_ms"].iloc[0] == pytest.approx(0.02)
    assert top["shape"].iloc[0] == "1x64x64x64" and top["shape"].iloc[1] == "4x8"
    assert top["intensity"].iloc[0] == pytest.approx(2 * 64.0 ** 3 / (12 * 64.0 ** 2))
    assert top["achieved_gflops"].iloc[0] == pytest.approx(2 * 64.0 ** 3 / 1e-5 / 1e9)


# ----- pasted configs

@pytest.mark.parametrize("text, match", [
    ("", "empty"), ("   \n", "empty"), (None, "No config"), (42, "must be text"),
    ('{"model_type": "gpt2", "n_layer": 2,', "not valid JSON"),
    ("{'model_type': 'gpt2'}", "Python dict"),
    ('{"model_type": "gpt2", "n_layer": 2,}', "trailing comma"),
    ("[1, 2, 3]", "JSON object"), ('"gpt2"', "JSON object"),
    ('{"n_layer": 2}', "model_type"), ('{"model_type": "not-a-model"}', "Unknown model_type"),
])
def test_bad_pasted_configs_give_a_message_not_an_exception(text, match):
    cfg, err = parse_pasted_config(text)
    assert cfg is None and isinstance(err, str) and match in err


def test_good_pasted_config_with_or_without_a_code_fence():
    text = json.dumps(TINY, indent=2)
    assert parse_pasted_config(text) == (TINY, None)
    assert parse_pasted_config(f"```json\n{text}\n```") == (TINY, None)


# ----- the UI, without a browser

def test_explorer_builds_and_its_callbacks_run(data_dir):
    ex = build_explorer(gpus=["H100", "A100 80GB"], model=TINY, step=Step(2, 128), auto=False,
                        settings=QUICK)
    assert ex.result is None and ex.model.value == "(pasted config)"
    assert set(ex.gpu_select.value) == {"NVIDIA_H100_80GB_HBM3", "NVIDIA_A100_80GB_PCIe"}
    res = ex.update()
    assert ex.error is None and res is not None and len(res["summary"]) == 2
    assert ex.figure is not None and "outside the training GPUs" in ex.message.value
    # one folded line for the scenario: the figures sit inside <details>
    msg = ex.message.value
    assert msg.count("<details") == 1 and msg.count("outside the training GPUs") == 1
    assert "Mem_Bw" in msg.split("<summary>")[1].split("</summary>")[1]

    # a hypothetical GPU from the sliders joins the comparison
    ex.sliders["mem_bw"].value = 2.0
    ex.use_custom.value = True                      # the observer re-runs the update
    names = list(ex.result["summary"]["gpu"])
    assert len(names) == 3 and "mem_bw x2" in names[2] and ex.error is None

    # a broken paste: a message in the widget, no exception, no stale result shown as new
    ex.pasted.value = '{"model_type": "gpt2", "n_layer": '
    assert ex.error is not None and "not valid JSON" in ex.error
    assert "Error" in ex.message.value and "Traceback" not in ex.message.value
    # valid JSON that transformers cannot build: the trace error, as a message
    ex.pasted.value = json.dumps({**TINY, "n_embd": 250})
    assert ex.error is not None and "Traceback" not in ex.message.value
    # a sequence longer than the model allows
    ex.pasted.value = json.dumps(TINY)
    assert ex.error is None
    ex.seq.value = 4096
    assert ex.error is not None and "seq" in ex.error
    ex.seq.value = 128
    # no GPU at all
    ex.use_custom.value = False
    ex.gpu_select.value = ()
    assert ex.error is not None and "select at least one GPU" in ex.error
    ex.gpu_select.value = ("NVIDIA_H100_80GB_HBM3",)
    assert ex.error is None

    # a model from the dropdown
    ex.model.value = "gpt2_large"
    ex.batch.value = 1
    assert ex.error is None and ex.result["params"]["model"] == "gpt2_large"


def test_cached_update_traces_nothing(data_dir, monkeypatch):
    """Once a scenario is traced, an update (the same one, or a new hypothetical GPU) only
    prices: the tracer is never called again. Its speed is a benchmark's figure
    (``benchmarks/bench_predict.py``), not a timed test."""
    import nslib.model.inputs as inputs

    ex = build_explorer(gpus=["H100", "A100 80GB", "A100-PCIE-40GB"], model=TINY,
                        step=Step(2, 256), hypothetical={"mem_bw": 2.0}, settings=QUICK)
    assert ex.error is None and len(ex.result["summary"]) == 4

    def no_trace(*args, **kwargs):
        raise AssertionError("a cached update traced the model again")
    monkeypatch.setattr(inputs, "trace", no_trace)
    ex.update()                                    # everything cached now
    assert ex.error is None and ex.seconds is not None
    ex.sliders["peak_gflops"].value = 2.0           # one new (hypothetical) GPU to predict
    assert ex.error is None and len(ex.result["summary"]) == 4


# ----- 16 bits

TINY_LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 1000, "max_position_embeddings": 1024}


def test_scenario_in_bf16_prices_attention_and_halves_memory(mixed_dir):
    gpus = explorer_gpus()
    with_bf16 = [g for g in gpus.values() if g.bf16_gflops][:2]
    assert len(with_bf16) == 2  # the 16-bit data's datasheets join the explorer's GPUs
    fp32 = scenario(with_bf16, TINY_LLAMA, Step(2, 128, "inf"), settings=QUICK)
    bf16 = scenario(with_bf16, TINY_LLAMA, Step(2, 128, "inf", dtype="bf16"), settings=QUICK)
    assert "attention" in bf16["per_class"] and "attention" not in fp32["per_class"]
    assert bf16["params"]["dtype"] == "bf16"
    w16 = bf16["memory"]["weights"].to_numpy()
    np.testing.assert_allclose(w16, fp32["memory"]["weights"].to_numpy() / 2, rtol=0.01)
    assert not any("tiles and waves" in w for w in bf16["warnings"])


def test_scenario_bf16_needs_the_tensor_peak(base):
    with pytest.raises(ValueError, match="Bf16FLOPs"):
        scenario([base], TINY_LLAMA, Step(1, 64, "inf", dtype="bf16"), settings=QUICK)


def test_explorer_dtype_control(mixed_dir):
    key = next(k for k, g in explorer_gpus().items() if g.bf16_gflops)
    ex = build_explorer(gpus=[key], model=TINY_LLAMA, step=Step(1, 64), auto=False,
                        settings=QUICK)
    ex.dtype.value = "bf16"  # the callback recomputes
    assert ex.error is None and ex.result["params"]["dtype"] == "bf16"
    assert "attention" in ex.result["per_class"]


def test_a_gpu_whose_power_sets_its_step_is_named(base):
    # the same A100 on a 5 W board: its GEMMs take what 5 W allows (nslib.kernels.power)
    starved = hypothetical_gpu(base, name="Starved", tdp_w=5.0)
    res = scenario([starved, base], TINY, Step(4, 512, "inf"), settings=QUICK)
    hit = [w for w in res["warnings"] if "the board's power sets" in w]
    assert len(hit) == 1 and hit[0].startswith("Starved: the board's power sets")
    # the training GPUs' best, 72.5 GFLOP/s per W, times 5 W; 2% of the A100's FP32 peak
    assert "at most 0.4 TFLOP/s (2% of the FP32 peak, 72.5 GFLOP/s per W" in hit[0]
