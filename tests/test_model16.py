"""16-bit model path: bf16 traces (bytes, SDPA as attention rows), 16-bit pricing, the CLI's
Bf16FLOPs error and the layer-check kernels. Expected numbers are hand arithmetic."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT

from nslib.data.gpus import GPU
from nslib.evaluation import layer_check
from nslib.model import stream
from nslib.model.config import load_model_config
from nslib.model.trace import ATTENTION_COLUMNS, MEMORY_COLUMNS, TRACE_COLUMNS, trace
from nslib.model.step import Parallel, Step

LLAMA3_8B = ROOT / "notebooks" / "configs" / "llama3_8b.json"  # the notebooks' config

HID, FF, HEADS, KV, LAYERS, VOCAB = 64, 128, 4, 2, 2, 100
LLAMA = dict(model_type="llama", hidden_size=HID, intermediate_size=FF,
             num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV,
             vocab_size=VOCAB, max_position_embeddings=64)
BATCH, SEQ = 2, 16
D = HID // HEADS


@pytest.fixture(scope="module")
def traces():
    return {dt: trace(LLAMA, Step(BATCH, SEQ, "inf", dtype=dt)) for dt in ("fp32", "bf16")}


def _linear(df):
    lin = df[df["cls"] == "linear"]
    return sorted(zip(lin["M"], lin["N"], lin["K"], lin["bytes"]))


def test_gemm_bytes_halve(traces):
    fp, half = _linear(traces["fp32"]), _linear(traces["bf16"])
    assert [r[:3] for r in fp] == [r[:3] for r in half]
    assert all(h[3] * 2 == f[3] for f, h in zip(fp, half))
    # q projection: (32 x 64) @ (64 x 64) at 2 bytes
    t = BATCH * SEQ
    assert (t, HID, HID, 2 * (t * HID + HID * HID + t * HID)) in half


def test_residual_add_bytes_halve(traces):
    for dt, elem in (("fp32", 4), ("bf16", 2)):
        df = traces[dt]
        adds = df[(df["op"] == "add") & (df["H"] == HID) & (df["layer"] == 0)]
        assert len(adds) == 2   # the two residual adds of a block
        assert (adds["bytes"] == BATCH * SEQ * HID * elem * 3).all()


def test_sdpa_is_one_attention_row_per_layer(traces):
    half, fp = traces["bf16"], traces["fp32"]
    att = half[half["cls"] == "attention"]
    assert len(att) == LAYERS and sorted(att["layer"]) == list(range(LAYERS))
    assert not half["cls"].isin(["bmm", "softmax"]).any()      # no decomposition recorded
    assert (fp["cls"] == "bmm").sum() == 2 * LAYERS and "attention" not in set(fp["cls"])
    row = att.iloc[0]
    assert (row["B"], row["M"], row["N"], row["K"], row["H"]) == (BATCH, SEQ, D, SEQ, HEADS)
    assert row["kv_heads"] == KV and row["causal"] == 1.0
    pairs = SEQ * SEQ - SEQ * (SEQ - 1) / 2                     # causal: 136 of 256
    assert row["flops"] == 4 * BATCH * HEADS * pairs * D
    assert row["bytes"] == 2 * (2 * BATCH * HEADS * SEQ * D + 2 * BATCH * KV * SEQ * D)


def test_fp32_trace_columns_unchanged(traces):
    assert list(traces["fp32"].columns) == list(TRACE_COLUMNS) + list(MEMORY_COLUMNS)
    assert list(traces["bf16"].columns) == (list(TRACE_COLUMNS) + list(MEMORY_COLUMNS)
                                            + list(ATTENTION_COLUMNS))
    again = trace(LLAMA, Step(BATCH, SEQ, "inf"))
    pd.testing.assert_frame_equal(again, traces["fp32"])


def test_train_records_attention_backward():
    df = trace(LLAMA, Step(BATCH, SEQ, "train", dtype="bf16"))
    att = df[df["cls"] == "attention"]
    fw, bw = att[att["op"] == "attention"], att[att["op"] == "attention_bw"]
    assert len(fw) == len(bw) == LAYERS and (bw["phase"] == "bw").all()
    assert np.allclose(sorted(bw["flops"]), [2.5 * fw["flops"].iloc[0]] * LAYERS)


def test_bad_dtype():
    with pytest.raises(ValueError, match="unknown dtype"):
        trace(LLAMA, Step(BATCH, SEQ, "inf", dtype="int8"))


GPU16 = GPU(name="Test GPU", mem_gb=80.0, mem_bw=2000.0, num_sm=100, cores_per_sm=64,
            clock_mhz=1500.0, peak_gflops=20000.0, l2_mb=40.0, bf16_gflops=300000.0)


class _Roof:
    """A 16-bit predictor stand-in: FLOPs at the tensor-core peak (ms)."""

    def __init__(self, flops):
        self.flops = flops

    def predict(self, frame):
        return self.flops(frame) / (frame["bf16_gflops"].to_numpy(float) * 1e9) * 1e3


def test_tensor_rows_mapping():
    frame = pd.DataFrame({"cls": ["bmm", "linear", "attention", "attention", "linear"],
                          "op": ["bmm", "linear", "attention", "attention_bw", "linear"],
                          "B": [3.0, 1, 2, 2, 1], "M": [4.0, 5, 8, 8, 5], "N": [6.0, 7, 16, 16, 7],
                          "K": [9.0, 11, 8, 8, 11], "H": [np.nan, np.nan, 4, 4, np.nan],
                          "kv_heads": [np.nan, np.nan, 2, 2, np.nan],
                          "causal": [np.nan, np.nan, 1, 1, np.nan]})
    frame["bytes"] = [2.0 * 3 * (4 * 6 + 6 * 9 + 4 * 9), 2.0 * (5 * 7 + 7 * 11 + 5 * 11), 1, 1,
                      4.0 * (5 * 7 + 7 * 11 + 5 * 11)]   # the last GEMM stayed FP32
    g = stream.gemm_inputs(frame.iloc[:2])
    assert g.to_dict("list") == {"m": [12.0, 5.0], "n": [9.0, 11.0], "k": [6.0, 7.0]}
    gemm = _Roof(lambda f: 2 * f["m"] * f["n"] * f["k"])
    attn = _Roof(lambda f: 4 * f["batch"] * f["heads"] * f["q_len"] * f["kv_len"]
                 * f["head_dim"])
    ms = stream.tensor_ms(frame, GPU16, gemm, attn)
    peak = 3e14
    assert ms[0] == pytest.approx(2 * 12 * 9 * 6 / peak * 1e3)
    assert ms[2] == pytest.approx(4 * 2 * 4 * 8 * 8 * 16 / peak * 1e3)
    assert ms[3] == pytest.approx(2.5 * ms[2])
    assert np.isnan(ms[4])          # FP32 GEMM: left to the FP32 predictor


def test_fp32_equivalent_halves_h():
    frame = pd.DataFrame({"cls": ["elementwise", "layernorm", "elementwise"],
                          "op": ["add", "ln", "mul"], "B": [8.0, 8, 8], "H": [64.0, 64, 64],
                          "M": np.nan, "N": np.nan, "K": np.nan,
                          "bytes": [8 * 64 * 2 * 3.0, 8 * 64 * 2 * 2.0, 8 * 64 * 4 * 3.0]})
    out = stream.fp32_equivalent(frame)
    assert out["H"].tolist() == [32.0, 32.0, 64.0] and out["B"].tolist() == [8.0] * 3


def test_half_needs_bf16flops():
    with pytest.raises(ValueError, match="Bf16FLOPs"):
        stream.datasheet_columns(GPU(**{**GPU16.__dict__, "bf16_gflops": None}))


def test_cli_bf16_without_bf16flops(tmp_path, capsys):
    from nslib.cli.commands import main
    spec = {"Device": "Old GPU", "Dev_Mem": 16, "Mem_Bw": 900, "Num_Sm": 80,
            "Core_Per_SM": 64, "Freq": 1500, "SingleFLOPs": 15000, "L2Cache": 6}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(spec))
    cfg = tmp_path / "llama.json"
    cfg.write_text(json.dumps(LLAMA))
    code = main(["predict", "--model", str(cfg), "--gpu-spec", str(path), "--batch", "1",
                 "--seq", "8", "--dtype", "bf16"])
    assert code == 2
    assert "Bf16FLOPs" in capsys.readouterr().err


def test_llama3_8b_config_traces_in_bf16():
    cfg = load_model_config(str(LLAMA3_8B))
    df = trace(dict(cfg, num_hidden_layers=1), Step(1, 128, "inf", dtype="bf16"))
    att = df[df["cls"] == "attention"].iloc[0]
    assert (att["H"], att["kv_heads"], att["N"]) == (32, 8, 128)
    qkv = df[(df["cls"] == "linear") & (df["layer"] == 0)].iloc[:3]
    assert qkv["K"].tolist() == [4096, 1024, 1024]


def test_layer_kernels_by_hand():
    row = pd.DataFrame([{"gpu": "G", "model": "m", "num_tokens": 512, "tp": 2, "n_head": 32,
                         "n_kv_head": 8, "n_embd": 4096, "n_expanded_embd": 14336,
                         "vocab_size": 128256, "use_gated_mlp": True, "op": op,
                         "latency_ms": 1.0} for op in layer_check.OP_CLASS])
    k = layer_check.layer_kernels(row).set_index("layer_op")
    T, d = 512, 128
    qkv = k.loc["attn_pre_proj"]
    assert (qkv["M"], qkv["N"], qkv["K"]) == (T, 4096, (32 + 16) * d / 2)
    assert qkv["bytes"] == 2 * (T * 4096 + 4096 * 3072 + T * 3072)
    assert tuple(k.loc["attn_post_proj", ["N", "K"]]) == (32 * d / 2, 4096)
    assert tuple(k.loc["mlp_up_proj", ["N", "K"]]) == (4096, 14336)         # 2 x 14336 / 2
    assert tuple(k.loc["mlp_down_proj", ["N", "K"]]) == (7168, 4096)
    act = k.loc["mlp_act"]
    assert (act["op"], act["B"], act["H"], act["bytes"]) == ("mul", T, 7168, T * 7168 * 2 * 3)
    rope = k.loc["attn_rope"]
    assert (rope["H"], rope["bytes"]) == (40 * d / 2, T * 2560 * 2 * 2)
    norm = k.loc["input_layernorm"]
    assert (norm["cls"], norm["H"], norm["bytes"]) == ("layernorm", 4096, T * 4096 * 2 * 2)
    assert k.loc["add", "bytes"] == T * 4096 * 2 * 3
    assert math.isclose(k.loc["mlp_down_proj", "flops"], 2 * T * 7168 * 4096)


def test_layer_sums_and_report():
    frame = pd.DataFrame({"gpu": "G", "model": "m", "num_tokens": [256, 256, 128, 128],
                          "tp": 1, "layer_op": ["add", "mlp_up_proj"] * 2,
                          "latency_ms": [1.0, 3.0, 1.0, 1.0], "pred_ms": [1.5, 3.3, 1.0, 1.0]})
    sums = layer_check.layer_sums(frame)
    assert sums["error_pct"].round(6).tolist() == [20.0, 0.0]
    rep = layer_check.layer_report(frame).loc["G"]
    assert [round(rep[c], 6) for c in ("layer", "n", "add", "gemm")] == [20.0, 1, 50.0, 10.0]


def test_source_agreement_by_hand(monkeypatch):
    layers = pd.DataFrame([{"gpu": "G", "model": "m", "num_tokens": t, "tp": 1, "n_head": 32,
                            "n_kv_head": 32, "n_embd": 4096, "n_expanded_embd": 11008,
                            "vocab_size": 32000, "use_gated_mlp": True, "op": op,
                            "latency_ms": ms}
                           for t, op, ms in [(512, "attn_post_proj", 0.22),
                                             (512, "attn_pre_proj", 0.75),
                                             (512, "mlp_down_proj", 0.6),
                                             (512, "add", 0.05),           # not a GEMM
                                             (128, "attn_post_proj", 0.10)]])  # < 256 tokens
    # rows as [m x k] @ [k x n]: the output projection is m 512, k 4096, n 4096; the down
    # projection reduces over 11008 into 4096 (k 11008, n 4096: its transpose has no row);
    # QKV's n 12288 has no row
    table = pd.DataFrame({"gpu": "G", "m": [512.0, 128.0, 512.0, 512.0, 512.0],
                          "n": [4096.0, 4096.0, 8192.0, 4096.0, 11008.0],
                          "k": [4096.0, 4096.0, 4096.0, 11008.0, 4096.0],
                          "latency_ms": [0.2, 0.05, 0.4, 0.5, 9.9]})
    monkeypatch.setattr(layer_check.mixed_data, "layer_table", lambda mixed=None: layers)
    monkeypatch.setattr(layer_check.mixed_data, "gemm_table", lambda mixed=None: table)
    out = layer_check.source_agreement().loc["G"]
    assert out["shapes"] == 2
    assert out["attn_post_proj"] == pytest.approx(1.1)
    assert out["mlp_down_proj"] == pytest.approx(1.2)
    assert out["median"] == pytest.approx(1.15)


class _Fp32Roof:
    """An FP32 predictor stand-in: the FP32 roofline of each kernel (ms)."""

    def predict(self, frame):
        from nslib.kernels import sizes
        return sizes.roofline_ms(frame)


@pytest.mark.filterwarnings("ignore::nslib.predictors.gpu_range.DatasheetRangeWarning")
def test_predict_model_bf16_prices_each_kind():
    from nslib.kernels import sizes
    from nslib.model.inputs import traced
    from nslib.model.predict import predict_model
    gemm = _Roof(lambda f: 2 * f["m"] * f["n"] * f["k"])
    attn = _Roof(lambda f: 4 * f["batch"] * f["heads"] * f["q_len"] * f["kv_len"]
                 * f["head_dim"])
    frame, summ = predict_model(GPU16, LLAMA, Step(BATCH, SEQ, "inf", "bf16"), _Fp32Roof(),
                                tensor_predictor=(gemm, attn), launch_us=None)
    assert summ["dtype"] == "bf16" and summ["per_class_ms"]["attention"] > 0
    assert summ["e2e_ms"] == pytest.approx(frame["pred_ms"].sum())
    lin = frame[frame["cls"] == "linear"].iloc[0]
    assert lin["pred_ms"] == pytest.approx(2 * lin["M"] * lin["N"] * lin["K"] / 3e14 * 1e3)
    add = frame[(frame["op"] == "add") & (frame["H"] == HID)].iloc[0]
    # 16-bit add at its real bytes (2 per element) on the 2000 GB/s bandwidth
    assert add["pred_ms"] == pytest.approx(BATCH * SEQ * HID * 2 * 3 / 2e12 * 1e3)
    assert "attention" not in set(traced(LLAMA, BATCH, SEQ, "inf")["cls"])
    assert sizes.BYTES_PER_ELEM == 4


def test_bf16_tensor_parallel_inference(data_dir, mixed_dir):
    from nslib.model.predict import predict_model
    frame, s = predict_model("H100", LLAMA, Step(2, 16, "inf", "bf16"), "roofline",
                             tensor_predictor="roofline", parallel=Parallel(tp=2))
    comm = frame[frame["cls"] == "comm"]
    layer = comm[comm["layer"] >= 0]
    # two all-reduces per block, each of the block's output in 16 bits
    assert len(layer) == 2 * LAYERS and (layer["bytes"] == BATCH * SEQ * HID * 2).all()
    gemm = frame[frame["cls"] == "linear"]
    assert (sizes_elem(gemm) == 2).all()            # sharded GEMMs stay 16-bit
    assert s["parallel"]["kind"] == "tp" and s["dtype"] == "bf16" and s["comm_ms"] > 0
    with pytest.raises(ValueError, match="tensor-parallel inference"):
        predict_model("H100", LLAMA, Step(2, 16, "train", "bf16"), "roofline",
                      tensor_predictor="roofline", parallel=Parallel(tp=2))


def sizes_elem(frame):
    from nslib.kernels import sizes
    return np.round(sizes.elem_bytes(frame))
