"""nslib.model.parallel: links, DP/TP/PP schedules on a tiny GPT-2 with a constant-latency
predictor, checked against hand arithmetic; invalid degrees rejected."""
import json

import numpy as np
import pandas as pd
import pytest

from nslib.data.gpus import GPU
from nslib.model.inputs import traced
from nslib.model.parallel import (LinkSpec, default_link, dp_schedule, gpipe_time, model_info,
                                  resolve_link, shard_tensor_parallel)
from nslib.model.predict import predict_model
from nslib.model.step import Step, split_options

CFG = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 4, "n_positions": 64,
       "vocab_size": 500}
BATCH, SEQ, H = 4, 16, 64
GPU0 = GPU(name="Test GPU", mem_gb=80, mem_bw=3000, num_sm=100, cores_per_sm=128,
           clock_mhz=1500, peak_gflops=50000, l2_mb=50)
# 50 GB/s as seen by a transfer, no latency: easy arithmetic
LINK = LinkSpec(50.0, utilisation=1.0, latency_us=0.0, halved=False)
BLOCK_PARAMS = 12 * H * H + 13 * H        # ln_1, c_attn, c_proj, ln_2, c_fc, c_proj
OTHER_PARAMS = 500 * H + 64 * H + 2 * H   # wte (tied with lm_head), wpe, ln_f


class Const:
    """A predictor: every kernel takes 1 ms."""

    def predict(self, frame):
        return np.ones(len(frame))


def run(**kw):
    kw.setdefault("link", LINK)
    launch_us = kw.pop("launch_us", None)  # plain sums: the schedules are what is checked here
    step, par = split_options(kw.pop("batch", BATCH), SEQ, kw.pop("mode", "train"), **kw)
    return predict_model(GPU0, CFG, step, Const(), parallel=par, launch_us=launch_us)


# ----- links

def test_link_arithmetic():
    lk = LinkSpec(100.0, utilisation=0.5, latency_us=2.0)   # halved: 25 GB/s per transfer
    assert lk.effective_gbps == 25.0
    # ring all-reduce of 1 GB over 4 GPUs: 2*3/4 * 1e9 / 25e9 s = 60 ms, plus 6 hops of 2 us
    assert lk.allreduce_ms(1e9, 4) == pytest.approx(60.0 + 6 * 0.002)
    assert lk.allreduce_ms(1e9, 1) == 0.0
    assert lk.p2p_ms(1e9) == pytest.approx(40.0 + 0.002)
    with pytest.raises(ValueError):
        LinkSpec(0.0)


def test_default_links(data_dir, tmp_path):
    from nslib.model.inputs import resolve_gpu
    h100, a100 = resolve_gpu("NVIDIA_H100_80GB_HBM3"), resolve_gpu("NVIDIA_A100-SXM4-40GB")
    assert default_link(h100).bandwidth_gbps == 900 and default_link(h100).effective_gbps == 324
    assert default_link(a100).bandwidth_gbps == 600
    assert default_link(a100).effective_gbps == pytest.approx(216)
    assert default_link(resolve_gpu("Tesla_T4")).bandwidth_gbps == 32     # its Link_Bw
    # the datasheet decides, never the name: an "H100" without Link_Bw gets the fallback
    bare = {k: v for k, v in h100.to_json().items() if k != "Link_Bw"}
    (tmp_path / "bare.json").write_text(json.dumps(bare))
    from nslib.model.parallel.links import FALLBACK_LINK_GBPS
    lk = default_link(resolve_gpu(tmp_path / "bare.json"), spec_path=tmp_path / "bare.json")
    assert lk.bandwidth_gbps == FALLBACK_LINK_GBPS and "no Link_Bw" in lk.source
    raw = {**h100.to_json(), "Link_Bw": 450}
    path = tmp_path / "my_gpu.json"
    path.write_text(json.dumps(raw))
    lk = default_link(h100, spec_path=path)
    assert lk.bandwidth_gbps == 450 and "Link_Bw" in lk.source
    assert resolve_link(123, h100).bandwidth_gbps == 123
    assert resolve_link(None, h100).bandwidth_gbps == 900


# ----- data parallel

def test_dp_schedule_by_hand():
    # forward 2 kernels; backward: layer 1 dX, dW (reads a forward tensor), layer 0 dX, dW
    fw = [{"kid": 0, "phase": "fw", "cls": "linear", "inputs": (), "layer": 1},
          {"kid": 1, "phase": "fw", "cls": "linear", "inputs": (0,), "layer": 0}]
    bw = [{"kid": 2, "phase": "bw", "cls": "linear", "inputs": (), "layer": 1},
          {"kid": 3, "phase": "bw", "cls": "linear", "inputs": (1, 2), "layer": 1},
          {"kid": 4, "phase": "bw", "cls": "linear", "inputs": (3,), "layer": 0},
          {"kid": 5, "phase": "bw", "cls": "linear", "inputs": (0, 4), "layer": 0}]
    frame = pd.DataFrame(fw + bw).assign(pred_ms=1.0)
    lk = LinkSpec(1.0, utilisation=1.0, latency_us=0.0, halved=False)     # 1 GB/s
    # n = 2: all-reduce = bytes / 1 GB/s; blocks 3 ms each, the rest 0.5 ms
    s = dp_schedule(frame, 2, lk, {1: 3e6, 0: 3e6, -1: 0.5e6})
    # layer 1 issued at 2 (its dW ends), runs 2-5; layer 0 issued at 4, runs 5-8; the rest
    # issued at the end of the backward (4), runs 8-8.5
    assert [(b["layer"], b["start_ms"], b["end_ms"]) for b in s["buckets"]] == \
        [(1, 2.0, 5.0), (0, 5.0, 8.0), (-1, 8.0, 8.5)]
    assert s["fw_ms"] == 2 and s["bw_ms"] == 4 and s["finish_ms"] == 8.5
    assert s["e2e_ms"] == 2 + 8.5 and s["exposed_comm_ms"] == 4.5 and s["comm_ms"] == 6.5


def test_model_info_counts_parameters_per_block():
    info = model_info(CFG, "train")
    assert (info["heads"], info["layers"], info["hidden"], info["vocab"]) == (4, 4, H, 500)
    assert info["param_bytes"] == {**{l: 4.0 * BLOCK_PARAMS for l in range(4)},
                                   -1: 4.0 * OTHER_PARAMS}
    assert info["vocab_modules"] == ("transformer.wte",)


def test_dp_totals_by_hand():
    n = 2
    tr = traced(CFG, BATCH // n, SEQ, "train")
    n_fw, n_bw = int((tr["phase"] == "fw").sum()), int((tr["phase"] == "bw").sum())
    # a slow link: each block's all-reduce takes 10 ms (n = 2: bytes / bandwidth)
    bw_gbs = 4.0 * BLOCK_PARAMS / 10e-3 / 1e9
    lk = LinkSpec(bw_gbs, utilisation=1.0, latency_us=0.0, halved=False)
    t_block, t_other = 10.0, 10.0 * OTHER_PARAMS / BLOCK_PARAMS
    frame, s = run(dp=n, link=lk)
    # issue times: end of each block's last weight-gradient GEMM (a backward linear kernel
    # reading a forward tensor), in backward kernels of 1 ms
    bw = tr[tr["phase"] == "bw"].reset_index(drop=True)
    fw_kids = set(tr.loc[tr["phase"] == "fw", "kid"])
    dw = bw["cls"].eq("linear") & bw["inputs"].map(lambda ins: any(k in fw_kids for k in ins))
    issue = {l: float(bw.index[dw & (bw["layer"] == l)].max() + 1) for l in range(4)}
    t = 0.0
    for l in (3, 2, 1, 0):                     # the backward runs the last block first
        t = max(t, issue[l]) + t_block
    t = max(t, n_bw) + t_other                 # embeddings etc. when the backward ends
    assert s["fw_ms"] == n_fw and s["bw_ms"] == n_bw
    assert s["parallel"]["finish_ms"] == pytest.approx(t)
    assert s["e2e_ms"] == pytest.approx(n_fw + max(n_bw, t))
    assert s["comm_ms"] == pytest.approx(4 * t_block + t_other)
    assert s["parallel"]["per_gpu_batch"] == 2 and s["parallel"]["kind"] == "dp"
    assert int((frame["cls"] == "comm").sum()) == 5
    # a fast link hides everything but the last all-reduce
    _, s2 = run(dp=n)
    last = 4.0 * OTHER_PARAMS / 50e9 * 1e3
    assert s2["e2e_ms"] == pytest.approx(n_fw + n_bw + last)
    # inference: no gradients, just batch / n
    _, s3 = run(dp=n, mode="inf")
    assert s3["e2e_ms"] == int((traced(CFG, 2, SEQ, "inf")["phase"] == "fw").sum())


# ----- tensor parallel

def test_tp_totals_and_shapes_by_hand():
    n = 2
    tr = traced(CFG, BATCH, SEQ, "train")
    frame, s = run(tp=n)
    comm = frame[frame["cls"] == "comm"]
    # two all-reduces per block each way, the embedding's (forward) and the LM head input
    # gradient's (backward); each of the activation, tokens x hidden FP32
    assert len(comm) == 2 * (2 * 4 + 1)
    assert (comm["bytes"] == 4 * BATCH * SEQ * H).all()
    t_ar = 4 * BATCH * SEQ * H / 50e9 * 1e3       # n = 2: 2*(n-1)/n = 1
    assert s["e2e_ms"] == pytest.approx(len(tr) + len(comm) * t_ar)
    assert s["comm_ms"] == pytest.approx(len(comm) * t_ar)
    assert s["n_kernels"] == len(tr)
    k = frame[frame["cls"] != "comm"].set_index("kid")
    fw0 = k[(k["phase"] == "fw") & (k["layer"] == 0)]
    lin = fw0[fw0["cls"] == "linear"][["M", "N", "K"]].to_numpy().tolist()
    T = BATCH * SEQ
    assert lin == [[T, H, 3 * H / n], [T, H / n, H], [T, H, 4 * H / n], [T, 4 * H / n, H]]
    assert (fw0.loc[fw0["cls"] == "bmm", "B"] == BATCH * 4 / n).all()
    assert (fw0.loc[fw0["cls"] == "softmax", "B"] == BATCH * 4 * SEQ / n).all()
    assert (fw0.loc[fw0["cls"] == "layernorm", "B"] == T).all()          # replicated
    head = k[(k["phase"] == "fw") & (k["module"] == "lm_head")]
    assert head[["M", "N", "K"]].to_numpy().tolist() == [[T, H, 250]]     # vocabulary split
    # every GEMM FLOP inside the blocks is divided by n
    src = tr.set_index("kid")
    inside = src.index[(src["layer"] >= 0) & src["cls"].isin(["linear", "bmm"])]
    assert k.loc[inside, "flops"].sum() == pytest.approx(src.loc[inside, "flops"].sum() / n)


def test_tp_shard_keeps_backward_weight_gradients_consistent():
    info = model_info(CFG, "train")
    tr = traced(CFG, BATCH, SEQ, "train")
    sh = shard_tensor_parallel(tr, 2, info)
    bw = sh[(sh["phase"] == "bw") & (sh["cls"] == "linear") & (sh["layer"] == 0)]
    # each backward GEMM of a split linear has half the FLOPs of the original
    src = tr.set_index("kid")
    assert bw["flops"].sum() == pytest.approx(src.loc[bw["kid"], "flops"].sum() / 2)


# ----- pipeline parallel

def test_gpipe_recursion_by_hand():
    # stages 1 and 3 ms, 3 micro-batches, 0.5 ms transfers: the slow stage finishes at
    # 1.5 + 3 = 4.5, then 7.5, 10.5 = sum + (M-1) * max + (n-1) * transfer
    assert gpipe_time([1.0, 3.0], 3, 0.5) == pytest.approx(10.5)
    assert gpipe_time([2.0, 2.0, 2.0, 2.0], 1, 0.1) == pytest.approx(8.3)
    assert gpipe_time([2.0] * 4, 5, 0.0) == pytest.approx((5 + 4 - 1) * 2.0)


@pytest.mark.parametrize("micro", [1, 2])
def test_pp_totals_by_hand(micro):
    n = 2
    mb = BATCH // micro
    tr = traced(CFG, mb, SEQ, "train")
    frame, s = run(pp=n, microbatches=micro)
    x = 4 * mb * SEQ * H / 50e9 * 1e3              # one activation transfer
    k = frame[frame["cls"] != "comm"]
    fw = [int(((k["phase"] == "fw") & (k["stage"] == st)).sum()) for st in range(n)]
    bw = [int(((k["phase"] == "bw") & (k["stage"] == st)).sum()) for st in range(n)]
    assert sum(fw) + sum(bw) == len(tr)
    # blocks 0-1 on stage 0, 2-3 on stage 1; the embeddings go first, the head last
    assert set(k.loc[k["layer"].isin([0, 1]), "stage"]) == {0}
    assert set(k.loc[k["layer"].isin([2, 3]), "stage"]) == {1}
    assert k.loc[k["module"] == "lm_head", "stage"].eq(1).all()
    assert k.loc[k["module"] == "transformer.wte", "stage"].eq(0).all()
    t_fw = sum(fw) + (micro - 1) * max(fw) + (n - 1) * x
    t_bw = sum(bw) + (micro - 1) * max(bw) + (n - 1) * x
    assert s["e2e_ms"] == pytest.approx(t_fw + t_bw)
    assert s["comm_ms"] == pytest.approx(2 * (n - 1) * x)
    assert int((frame["cls"] == "comm").sum()) == 2 * (n - 1)
    if micro == 1:   # one micro-batch: the single-GPU step plus the transfers
        _, single = predict_model(GPU0, CFG, Step(BATCH, SEQ, "train"), Const(),
                                  launch_us=None)
        assert s["e2e_ms"] == pytest.approx(single["e2e_ms"] + 2 * x)


# ----- invalid degrees

@pytest.mark.parametrize("kw, match", [
    (dict(tp=3), "heads"), (dict(pp=3), "layers"), (dict(dp=3), "batch"),
    (dict(dp=2, tp=2), "combining"), (dict(pp=2, microbatches=3), "micro-batches"),
    (dict(microbatches=2), "pipeline"), (dict(dp=0), "positive"), (dict(tp=8), "heads"),
])
def test_invalid_degrees_rejected(kw, match):
    with pytest.raises(ValueError, match=match):
        run(**kw)


def test_defaults_unchanged():
    f0, s0 = predict_model(GPU0, CFG, Step(BATCH, SEQ, "train"), Const(), launch_us=None)
    assert set(s0) == {"e2e_ms", "fw_ms", "bw_ms", "per_class_ms", "n_kernels", "launch_us",
                       "warnings"}
    assert "comm" not in f0["kernel_class"].values
    f1, s1 = predict_model(GPU0, CFG, Step(BATCH, SEQ, "inf", fused=True), Const(),
                           launch_us=None)
    assert s1["fused"] and s1["n_kernels"] < s1["n_kernels_unfused"]


def test_cli_parallel_flags(data_dir, capsys):
    from nslib.cli.commands import main
    args = ["predict", "--gpu", "H100", "--model", "gpt2_med", "--batch", "2", "--seq", "64",
            "--mode", "train", "--predictor", "roofline", "--json"]
    assert main(args + ["--tp", "2", "--link-bw", "100"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parallel"]["kind"] == "tp" and out["parallel"]["link"]["bandwidth_gbps"] == 100
    assert out["comm_ms"] > 0
    assert main(args + ["--pp", "5"]) == 2
    assert "layers" in capsys.readouterr().err
    assert main(args + ["--link-bw", "100"]) == 2
    assert main(args[:-1] + ["--dp", "2"]) == 0
    assert "dp2 on 2 GPUs" in capsys.readouterr().out
