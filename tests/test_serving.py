"""Serving forecasts: the schedules on a hand-priced engine (every number below is hand
arithmetic), the engine's kernels of a tiny Llama, the sample reader and the CLI."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from nslib.cli import main
from nslib.data.gpus import gpu_from_dict
from nslib.data.settings import Settings
from nslib.model.serving import Framework, Workload, kv_capacity, serve, waiting_note
from nslib.model.serving.schedule import _mixed, _waves, framework
from nslib.model.serving.steps import engine_kernels
from nslib.model.trace import trace
from nslib.model.step import Step

GPU = gpu_from_dict({"Device": "Test GPU", "Dev_Mem": 80, "Mem_Bw": 3000, "Num_Sm": 100,
                     "Core_Per_SM": 128, "Freq": 1500, "SingleFLOPs": 40000, "L2Cache": 40,
                     "Bf16FLOPs": 800000})


class LinearCost:
    """An engine whose iteration costs ``1 + 0.01 T`` ms (``T`` tokens), attention free."""

    def __init__(self, kv_per_token=1e5, weights=1e9, tp=1):
        self.spec, self.setup = GPU, SimpleNamespace(tp=tp, data=None)
        self._kv, self._w = kv_per_token, weights

    def tokens_ms(self, tokens, logits):
        return 1.0 + 0.01 * np.asarray(tokens, float)

    def attention_ms(self, phase, batch, q_len, kv_len):
        return np.zeros(np.broadcast(np.asarray(batch), np.asarray(kv_len)).shape)

    def kv_bytes_per_token(self):
        return self._kv

    def weight_bytes(self):
        return self._w


def test_waves_by_hand():
    # 4 prompts of 100 tokens, 2 per 200-token prefill batch: batches end at 3 and 6 ms
    fw = Framework("t", 200, False, 0.9)
    out = serve(LinearCost(), 4, 100, 11, fw)
    assert out["ttft_ms"] == pytest.approx(4.5)          # (3 + 3 + 6 + 6) / 4
    # decode of 4 tokens 1.04 ms, plus the later batches' 6 - 4.5 ms spread over 10 tokens
    assert out["tpot_ms"] == pytest.approx(1.04 + 0.15)
    assert out["queue_ms"] == 0 and out["running"] == 4


@pytest.mark.parametrize("mixed", [False, True])
def test_one_request_arrives_one_way(mixed):
    """At concurrency 1 alone and all at once are the same arrival: one TTFT, no range."""
    out = serve(LinearCost(), [1, 4], 300, 11, Framework("t", 128, mixed, 0.9, chunked=mixed))
    assert out["ttft_lone_ms"][0] == out["ttft_burst_ms"][0] == out["ttft_ms"][0]
    assert out["ttft_lone_ms"][1] <= out["ttft_ms"][1] <= out["ttft_burst_ms"][1]


def test_one_wave_when_the_budget_holds_every_prompt():
    out = serve(LinearCost(), 4, 100, 11, Framework("t", 8192, False, 0.9))
    assert out["ttft_ms"] == pytest.approx(5.0)          # one 400-token batch
    assert out["tpot_ms"] == pytest.approx(1.04)


def schedule_ttft(concurrency, isl, osl, fw) -> np.ndarray:
    """The mixed schedule's own TTFT (its groups), every request running (LinearCost's KV
    cache holds them all)."""
    c, isl, osl = (np.asarray(v, float) for v in np.broadcast_arrays(concurrency, isl, osl))
    return _mixed(LinearCost(), fw, c, isl, osl)["ttft_ms"]


def test_mixed_by_hand():
    # 10 requests of 100 + 11 tokens: one group (the room holds 81 prompts), so a request
    # decodes beside no other group's prompts and returns with no iteration running
    fw = Framework("m", 8192, True, 0.9)
    out = serve(LinearCost(), 10, 100, 11, fw)
    plain = 1.0 + 0.01 * 10                      # 9.09 decode tokens (10 priced)
    carry = 1.0 + 0.01 * 1000                    # the group's 1,000 prompt tokens, alone
    assert out["tpot_ms"] == pytest.approx(plain)
    assert schedule_ttft(10, 100, 11, fw) == pytest.approx(carry)
    # the forecast: the log-midpoint of alone (2.635 ms, below) and all at once (11 ms)
    lone = 0.5 * 1.09 + 2.09
    assert out["ttft_ms"] == pytest.approx(np.sqrt(lone * carry))
    assert out["latency_ms"] == pytest.approx(out["ttft_ms"] + 10 * plain)
    # the GPU's work per request is the schedule's cycle whatever the arrivals: the
    # throughput is the cycle's
    assert out["tokens_per_s"] == pytest.approx(10 / (carry + 10 * plain) * 1000 * 11)


def test_ttft_range_over_arrival_patterns_by_hand():
    # 10 requests of 100 + 11 tokens, mixed engine: the schedule admits them as one group
    # (TTFT 11 ms). Alone, a request's prompt rides beside the other 9 decodes (109 tokens,
    # 2.09 ms) after half a decode iteration of those 9 (1.09 / 2): 2.635 ms. All at once:
    # the 1,000 prompt tokens in one iteration, 11 ms, the schedule's own figure.
    out = serve(LinearCost(), 10, 100, 11, Framework("m", 8192, True, 0.9))
    assert out["ttft_lone_ms"] == pytest.approx(0.5 * 1.09 + 2.09)
    assert out["ttft_burst_ms"] == pytest.approx(11.0)
    assert out["ttft_lone_ms"] < out["ttft_ms"] < out["ttft_burst_ms"]
    # prefill-first, 4 requests in 200-token batches (TTFT 4.5, test_waves_by_hand): alone,
    # half a decode iteration of the other 3 (1.03 / 2) and its own 100-token batch (2 ms)
    out = serve(LinearCost(), 4, 100, 11, Framework("t", 200, False, 0.9))
    assert out["ttft_lone_ms"] == pytest.approx(0.5 * 1.03 + 2.0)
    assert out["ttft_burst_ms"] == pytest.approx(4.5)
    # a lone request with nothing else running waits for nothing
    one = serve(LinearCost(), 1, 100, 11, Framework("m", 8192, True, 0.9))
    assert one["ttft_lone_ms"] == pytest.approx(2.0) == pytest.approx(one["ttft_ms"])


def test_mixed_long_prompt_is_chunked():
    # one request, a 1,000-token prompt, a 400-token budget: its prompt takes k = 1000 / 399.7
    # = 2.50 iterations of ~400 tokens; the cycle is 1 + k iterations
    out = serve(LinearCost(), 1, 1000, 2, Framework("m", 400, True, 0.9))
    k = 2.5
    for _ in range(20):
        k = 1000 / (400 - 1 / (1 + k))
    assert k == pytest.approx(2.502, abs=1e-3)
    assert out["tpot_ms"] == pytest.approx(1.0 + 0.01)
    assert schedule_ttft(1, 1000, 2, Framework("m", 400, True, 0.9)) == \
        pytest.approx(k * (1.0 + 0.01 * np.ceil(1000 / k)), rel=1e-3)
    # alone or all at once are one request here: the range closes on the schedule's figure
    assert out["ttft_lone_ms"] == pytest.approx(out["ttft_ms"], rel=1e-3)
    assert out["ttft_burst_ms"] == pytest.approx(out["ttft_ms"], rel=1e-3)


def test_mixed_prefill_bound_by_hand():
    # 64 requests of 1,000 + 2 tokens on an engine taking whole prompts only, room for one
    # per iteration: 64 groups, every iteration carries a prompt (1,000 tokens) beside the
    # other groups' 63/64 decode token
    fw = Framework("m", 2000, True, 0.9, chunked=False)
    out = serve(LinearCost(), 64, 1000, 2, fw)
    carry = 1.0 + 0.01 * np.ceil(63 / 64 + 1000)
    assert out["tpot_ms"] == pytest.approx(carry)
    # the 62 iterations of the other groups' prompts (from the end of the iteration it
    # returned in), its own; with its decode, the cycle is the 64 carrying iterations
    assert schedule_ttft(64, 1000, 2, fw) == pytest.approx((62 + 1) * carry)
    # one prompt per iteration: the engine admits 1 request per carrying iteration
    assert out["tokens_per_s"] / 2 == pytest.approx(1000 / carry, rel=1e-3)


def test_more_requests_never_lower_a_mixed_engines_throughput():
    # a group's requests return at an iteration's end and the next ones join the next
    # iteration: with one or two output tokens every iteration carries prompts once groups
    # alternate, batched work per prompt no dearer (it was: a half-iteration wait on a
    # two-iteration cycle took a fifth off tokens/s from 8 to 16 requests). Token counts
    # priced whole move it by less than 0.1%
    for fw in (Framework("m", 8192, True, 0.9), Framework("w", 8192, True, 0.9, chunked=False)):
        for osl in (1, 2, 16, 128):
            rate = serve(LinearCost(), np.arange(1, 257), 1024, osl, fw)["tokens_per_s"]
            assert (np.diff(rate) >= -1e-3 * rate[1:]).all(), (fw.name, osl)


def test_chunked_prompts_fill_the_budget():
    # 8 requests of 4,096-token prompts, an 8,192-token budget beside ~8 decode tokens: an
    # engine that chunks prompts admits room / isl = 1.998 of them per iteration (the second's
    # last tokens in the next), so the forecast's TTFT grows with the prompt; one taking whole
    # prompts only
    # (TensorRT-LLM's default) admits 1 per iteration, a cheaper iteration than seven 1k
    # prompts fill, so its 4k TTFT stays below its 1k TTFT in steady state
    chunked, whole = Framework("c", 8192, True, 0.9), Framework("w", 8192, True, 0.9,
                                                                  chunked=False)
    isl = np.array([512, 1024, 2048, 4096, 6000])
    # the schedule's own TTFT: the iteration a group's prompts fill, about the budget's
    # tokens whatever the prompt once one fills it; the forecast's TTFT (its arrival range)
    # grows
    ttft = schedule_ttft(8, isl, 128, chunked)
    assert (np.diff(ttft) >= 0).all() and ttft[1] > 1.9 * ttft[0]
    assert (np.diff(serve(LinearCost(), 8, isl, 128, chunked)["ttft_ms"]) > 0).all()
    assert schedule_ttft(8, 4096, 128, whole) < schedule_ttft(8, 1024, 128, whole)
    # 4k prompts, chunked, by hand: a cycle of 128 iterations; 8 x 127 / 128 = 7.94 decode
    # tokens an iteration leave room for 8,184 prompt tokens, groups of 1.998 prompts, 4.004
    # groups; a carrying iteration holds the other groups' 5.96 decodes and 8,184 prompt
    # tokens (8,191 priced): a group's first tokens come with it
    carry = 1.0 + 0.01 * 8191
    assert schedule_ttft(8, 4096, 128, chunked) == pytest.approx(carry, rel=1e-4)


def test_a_chunk_of_a_prompt_pays_its_share_of_the_attention():
    from nslib.model.serving.schedule import _prompts_attention

    class PerPrompt(LinearCost):   # 2 ms of prefill attention per whole prompt
        def attention_ms(self, phase, batch, q_len, kv_len):
            return 2.0 * np.ceil(np.asarray(batch, float))

    got = _prompts_attention(PerPrompt(), np.array([0.5, 1.0, 1.4, 2.0]), 1000)
    assert got == pytest.approx([1.0, 2.0, 2.8, 4.0])


def test_kv_cache_bound_queues_by_littles_law():
    fw = Framework("m", 8192, True, 0.9)
    cost = LinearCost(kv_per_token=2e7)                  # room for a few requests only
    cap = kv_capacity(cost, fw)
    running = np.floor(cap["kv_tokens"] / 111)
    assert 1 <= running < 64
    out = serve(cost, 64, 100, 11, fw)
    assert out["running"] == running
    # Little's law on the schedule's cycle (the GPU's work per request): 64 clients served
    # `running` at a time wait (64 / running - 1) cycles for a slot
    one = _mixed(cost, fw, np.array([running]), np.array([100.0]), np.array([11.0]))
    cycle = one["ttft_ms"][0] + 10 * one["tpot_ms"][0]
    assert out["queue_ms"] + cycle == pytest.approx(64 / running * cycle)
    assert out["tokens_per_s"] == pytest.approx(running / cycle * 1000 * 11)
    assert out["ttft_ms"] > out["queue_ms"] > 0


def test_an_engine_that_keeps_one_request_waiting_serves_one_fewer():
    """A closed loop of 8 clients served 7 at a time: by Little's law each request waits
    8 / 7 - 1 = 1 / 7 of a cycle (one interval between completions), inside TTFT."""
    fw = Framework("w", 8192, True, 0.9, waiting=1)
    out = serve(LinearCost(), [1, 8], 100, 11, fw)
    assert list(out["running"]) == [1, 7] and not out["kv_bound"].any()
    one = _mixed(LinearCost(), fw, np.array([7.0]), np.array([100.0]), np.array([11.0]))
    cycle = one["ttft_ms"][0] + 10 * one["tpot_ms"][0]
    assert out["queue_ms"] == pytest.approx([0.0, cycle / 7])
    assert out["tokens_per_s"][1] == pytest.approx(7 / cycle * 1000 * 11)
    # the engine without the waiting request serves all eight
    plain = serve(LinearCost(), 8, 100, 11, Framework("m", 8192, True, 0.9))
    assert plain["running"] == 8 and plain["queue_ms"] == 0
    # a KV cache that holds fewer than 7 sets the count itself, and says so
    small = serve(LinearCost(kv_per_token=2e7), 64, 100, 11, fw)
    assert small["kv_bound"].all() and small["running"] < 63


def test_weights_that_do_not_fit():
    out = serve(LinearCost(weights=100e9), 8, 100, 11, "vllm")
    assert not out["fits"]


def test_bad_lengths_and_framework():
    with pytest.raises(ValueError, match="at least 1"):
        serve(LinearCost(), 0, 100, 10)
    with pytest.raises(ValueError, match="unknown serving framework"):
        serve(LinearCost(), 1, 100, 10, "tgi")


def test_sweep_is_monotone_in_concurrency():
    out = serve(LinearCost(), np.arange(1, 101), 512, 64, "vllm")
    assert (np.diff(out["tpot_ms"]) >= -1e-9).all()
    assert (np.diff(out["tokens_per_s"]) >= -1e-9).all()


@pytest.mark.parametrize("fw", ["vllm", "trtllm", "sglang"])
@pytest.mark.parametrize("isl,osl", [(512, 64), (1024, 16), (4096, 16)])
def test_ttft_inside_its_range_and_throughput_the_cycles(fw, isl, osl):
    c = np.arange(1, 161, dtype=float)
    out = serve(LinearCost(), c, isl, osl, fw)
    assert (out["ttft_lone_ms"] <= out["ttft_ms"] * (1 + 1e-9)).all()
    assert (out["ttft_ms"] <= out["ttft_burst_ms"] * (1 + 1e-9)).all()
    # the arrival pattern moves TTFT, not the GPU's work per request: throughput is the
    # schedule's own cycle whatever the TTFT forecast
    f = framework(fw)
    served = np.maximum(c - f.waiting, 1.0)     # an engine's waiting request is not served
    one = (_mixed if f.mixed else _waves)(LinearCost(), f, served, np.full_like(c, isl),
                                          np.full_like(c, osl))
    cycle = one["ttft_ms"] + (osl - 1) * one["tpot_ms"]
    assert out["tokens_per_s"] == pytest.approx(served / cycle * 1000 * osl)


def test_latency_is_ttft_plus_the_decode():
    out = serve(LinearCost(), [1, 16, 64], 128, [1, 8, 32], "vllm")
    assert out["latency_ms"] == pytest.approx(out["ttft_ms"] + (np.array([1, 8, 32]) - 1) *
                                              out["tpot_ms"])
    assert out["latency_ms"][0] == pytest.approx(out["ttft_ms"][0])


# -- the engine's kernels of a tiny Llama --------------------------------------------------

HID, FF, HEADS, KV, LAYERS, VOCAB = 64, 128, 4, 2, 2, 100
LLAMA = dict(model_type="llama", hidden_size=HID, intermediate_size=FF,
             num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV,
             vocab_size=VOCAB, max_position_embeddings=64)


def test_engine_kernels_merge_projections_and_vector_runs():
    from nslib.model.fusion import fuse
    tr = fuse(trace(LLAMA, Step(1, 16, "inf", dtype="bf16")), prologues=True)
    eng = engine_kernels(tr)
    layer = eng[eng["layer"] == 0]
    gemm = layer[layer["cls"] == "linear"]
    # q, k and v as one GEMM (64 + 2 * 2 * 16 outputs), gate and up as one, o and down
    assert sorted(gemm["K"]) == sorted([HID + 2 * KV * (HID // HEADS), HID, 2 * FF, HID])
    assert (layer["cls"] == "attention").sum() == 1
    # no two vector kernels in a row inside a layer
    kinds = layer["cls"].isin(["elementwise", "softmax", "layernorm", "memory"]).to_numpy()
    assert not (kinds[1:] & kinds[:-1]).any()
    assert (eng["layer"] < 0).sum() == (tr["layer"] < 0).sum()   # outside the layers as is


def test_step_cost_token_law(data_dir, mixed_dir):
    from nslib.model.serving import ServingSetup, StepCost
    cost = StepCost(ServingSetup(LLAMA, "H100", tp=2, predictor="roofline",
                                 tensor_predictor="roofline", quick=True))
    df = cost._frame(np.array([1000.0]), np.array([7.0]))
    gemm = df[df["cls"] == "linear"]
    head = gemm[df.loc[gemm.index, "head"]]
    assert (head["M"] == 7).all() and (gemm[~df.loc[gemm.index, "head"]]["M"] == 1000).all()
    assert (gemm["bytes"] < 4 * (gemm["M"] * gemm["N"] + gemm["N"] * gemm["K"] +
                                 gemm["M"] * gemm["K"])).all()      # 16-bit bytes
    comm = df[(df["cls"] == "comm") & (df["layer"] >= 0)]   # (and the embedding's)
    assert len(comm) == 2 * LAYERS and (comm["bytes"] == 1000 * HID * 2).all()
    assert cost.layers == LAYERS and cost.heads == HEADS / 2 and cost.kv_heads == KV / 2
    assert cost.kv_bytes_per_token() == 2 * LAYERS * (KV / 2) * (HID // HEADS) * 2
    t = cost.tokens_ms([1, 100, 10000], [1, 1, 1])
    assert (np.diff(t) > 0).all()
    a = cost.attention_ms("decode", [1, 8, 0], 1, 512)
    assert a[0] > 0 and a[1] >= a[0] and a[2] == 0


# -- the sample and the CLI ------------------------------------------------------------------

def test_sample_rows_say_why(mixed_dir, tmp_path):
    from nslib.data.serving_sample import serving_rows
    rows = serving_rows()
    assert (rows["reason"] == "").sum() > 0
    agg = rows[rows["mode"] == "agg"]
    assert agg.loc[agg["precision"].fillna("") != "", "reason"].str.startswith(
        "precision").all()
    assert (rows["reason"] != "").sum() + (rows["reason"] == "").sum() == len(rows)
    # a GPU with no datasheet is counted, not dropped
    priced = rows[rows["reason"] == ""].drop(columns=["gpu", "config", "framework", "reason"])
    priced.head(3).assign(system="zz_9000_sxm").to_csv(tmp_path / "s.csv", index=False)
    odd = serving_rows(tmp_path / "s.csv")
    assert len(odd) == 3
    assert (odd["reason"] == "no datasheet for system zz_9000_sxm").all()
    # a measurement that is not a number is its row's reason; a sample of no rows an error
    bad = priced.head(2).copy()
    bad["silicon_tpot_ms"] = bad["silicon_tpot_ms"].astype(object)
    bad.iloc[0, bad.columns.get_loc("silicon_tpot_ms")] = "fast"
    bad.to_csv(tmp_path / "t.csv", index=False)
    assert serving_rows(tmp_path / "t.csv")["reason"].tolist() == [
        "no positive measured TTFT/TPOT", ""]
    bad.head(0).to_csv(tmp_path / "h.csv", index=False)
    with pytest.raises(ValueError, match="h.csv: the serving sample has a header but no rows"):
        serving_rows(tmp_path / "h.csv")


def test_system_names_map_to_datasheets(mixed_dir):
    from nslib.data.serving_sample import system_gpus
    got = system_gpus(["h100_sxm", "a100_sxm", "l40s", "nonesuch", "h200_sxm", "b200_sxm",
                       "gb200_nvl72", "h100_sxm5", "rtx_pro_6000_server"])
    assert got["h100_sxm"].startswith("NVIDIA H100") and "nonesuch" not in got
    # datasheet-only GPUs of the 16-bit data, whatever the mounting words say
    assert got["h200_sxm"] == "NVIDIA H200" and got["b200_sxm"] == "NVIDIA B200"
    assert got["gb200_nvl72"] == "NVIDIA GB200" and got["h100_sxm5"] == got["h100_sxm"]
    assert got["rtx_pro_6000_server"].startswith("NVIDIA RTX PRO 6000")


def test_sample_file_errors(tmp_path, capsys):
    (tmp_path / "s.csv").write_text("a,b\n1,2\n")
    assert main(["eval-serving", "--sample", str(tmp_path / "s.csv")]) == 2
    assert "missing column" in capsys.readouterr().err
    assert main(["eval-serving", "--sample", str(tmp_path / "none.csv")]) == 2
    assert "no serving sample" in capsys.readouterr().err


def test_serve_cli_errors(capsys):
    assert main(["serve", "--model", "x.json", "--gpu", "H100", "--framework", "tgi"]) == 2
    assert "unknown --framework" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--model", "x", "--gpu", "H100", "--concurrency", "0"])


def test_serve_cli_json(data_dir, mixed_dir, tmp_path, capsys):
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(LLAMA))
    assert main(["serve", "--model", str(cfg), "--gpu", "H100", "--concurrency", "1", "4",
                 "--isl", "32", "--osl", "8", "--tensor-predictor", "roofline",
                 "--predictor", "roofline", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["concurrency"] for r in out["forecasts"]] == [1, 4]
    assert all(r["ttft_ms"] > 0 and r["tpot_ms"] > 0 for r in out["forecasts"])


def test_serve_cli_says_what_its_ttft_is(data_dir, mixed_dir, tmp_path, capsys):
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(LLAMA))
    args = ["serve", "--model", str(cfg), "--gpu", "H100", "--concurrency", "4", "--isl", "32",
            "--osl", "8", "--tensor-predictor", "roofline", "--predictor", "roofline",
            "--quick"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "ttft_ms: that wait plus the geometric mean of the rest of the range" in out
    assert "latency_ms: ttft_ms + (osl - 1) tpot_ms" in out
    assert main(args + ["--framework", "sglang"]) == 0
    assert "ttft_ms: its waves, the burst end" in capsys.readouterr().out


def test_serve_refuses_a_model_that_does_not_fit(data_dir, mixed_dir, tmp_path, capsys):
    """Weights larger than the GPU, or no room for one request's KV cache: one line saying
    which and what to raise, exit 2, no table (and no JSON forecast)."""
    big = dict(LLAMA, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
               num_attention_heads=64, num_key_value_heads=8,
               max_position_embeddings=8_000_000)
    cfg = tmp_path / "big.json"
    cfg.write_text(json.dumps(big))
    args = ["serve", "--model", str(cfg), "--gpu", "H100", "--concurrency", "4", "--osl", "8",
            "--tensor-predictor", "roofline", "--predictor", "roofline", "--quick"]
    assert main(args + ["--isl", "32"]) == 2
    err = capsys.readouterr()
    assert "the weights take" in err.err and "raise --tp (now 1)" in err.err and not err.out
    assert main(args + ["--isl", "32", "--json"]) == 2
    assert not capsys.readouterr().out
    assert main(args + ["--isl", "4000000", "--tp", "8"]) == 2
    assert "cannot hold one request of 4,000,008 tokens" in capsys.readouterr().err


# -- the explorer's serving view -------------------------------------------------------------

def test_serving_explorer_view(data_dir, mixed_dir):
    from nslib.explore.serving import concurrencies, serving_curves
    from nslib.explore.serving_ui import build_serving_explorer
    assert list(concurrencies(8)) == [1, 2, 3, 4, 6, 8]
    res = serving_curves(["H100", "no such GPU"], "meta-llama/Llama-3.1-8B-Instruct",
                         Workload(tp=1), most=8, settings=Settings(quick=True))
    assert set(res["curves"]["gpu"]) == {"NVIDIA H100 80GB HBM3"}
    assert any(n.startswith("no such GPU: not forecast") for n in res["notes"])
    # a GPU the weights do not fit on gets a note and no curve
    res = serving_curves(["L40S"], "Qwen/Qwen3-32B", Workload(tp=1), most=4,
                         settings=Settings(quick=True))
    assert res["curves"].empty and "not forecast: the weights" in res["notes"][0]
    # an engine that keeps a request waiting says so above its curves
    res = serving_curves(["H100"], "meta-llama/Llama-3.1-8B-Instruct",
                         Workload(tp=1, framework="trtllm"), most=4, settings=Settings(quick=True))
    assert res["notes"] == [waiting_note("trtllm")] and "all but 1" in res["notes"][0]
    assert list(res["curves"]["running"]) == [1, 1, 2, 3]
    ex = build_serving_explorer(gpus=["NVIDIA H100 80GB HBM3"],
                                model="meta-llama/Llama-3.1-8B-Instruct",
                                workload=Workload(tp=1), most=16,
                                settings=Settings(quick=True), hypothetical={"mem_bw": 2.0})
    assert ex.error is None
    got = ex.result["curves"].groupby("gpu")["tpot_ms"].min()
    assert got.loc["NVIDIA H100 80GB HBM3 (mem_bw x2)"] < got.loc["NVIDIA H100 80GB HBM3"]
    ex.use_custom.value = False
    ex.gpu_select.value = ()
    assert ex.error.startswith("select at least one GPU")


# -- intervals on serving forecasts -----------------------------------------------------------

class PartCost(LinearCost):
    """LinearCost split into parts: GEMMs 0.01 T, vectors 1 ms, no communication."""

    def token_parts(self, tokens, logits):
        t = np.asarray(tokens, float)
        return {"gemm": 0.01 * t, "vector": np.ones_like(t), "comm": np.zeros_like(t)}


def test_scaled_cost_scales_each_part():
    from nslib.model.serving import ScaledCost
    cost = ScaledCost(PartCost(), {"gemm": 2.0, "vector": 0.5})
    assert cost.tokens_ms(np.array([100.0]), 1)[0] == pytest.approx(2.0 * 1.0 + 0.5)
    assert cost.kv_bytes_per_token() == 1e5            # the rest is the wrapped cost's
    base = serve(PartCost(), 4, 100, 11, Framework("t", 200, False, 0.9))
    up = serve(ScaledCost(PartCost(), {"gemm": 2.0, "vector": 2.0}), 4, 100, 11,
               Framework("t", 200, False, 0.9))
    # every part twice as long: every time twice as long, throughput halved
    assert up["ttft_ms"] == pytest.approx(2 * base["ttft_ms"])
    assert up["tpot_ms"] == pytest.approx(2 * base["tpot_ms"])
    assert up["tokens_per_s"] == pytest.approx(base["tokens_per_s"] / 2)


def test_part_factors_from_calibrations(monkeypatch):
    from nslib.model.serving import forecast
    from nslib.predictors.intervals import Calibration
    monkeypatch.setattr(forecast, "tensor_calibration", lambda *a, **k: None)
    assert forecast.part_factors("nslib", "nslib") is None      # nothing cached: no interval
    tensor = Calibration("nslib", 0.8, {"gemm": (-0.1, 0.2), "attention": (0.0, 0.3)})
    vector = Calibration("nslib", 0.8, {"elementwise": (-0.05, 0.05)})
    monkeypatch.setattr(forecast, "tensor_calibration", lambda *a, **k: tensor)
    monkeypatch.setattr(forecast, "calibration", lambda *a, **k: vector)
    lo, hi, cover = forecast.part_factors("nslib", "nslib")
    assert cover == 0.8
    assert lo["gemm"] == pytest.approx(np.exp(-0.2)) and hi["gemm"] == pytest.approx(np.exp(0.1))
    assert lo["vector"] == pytest.approx(np.exp(-0.05))
    assert forecast.part_factors("nslib", ("a", "b")) is None   # fitted predictors: none
    monkeypatch.setattr(forecast, "calibration", lambda *a, **k: None)
    assert forecast.part_factors("nslib", "nslib") is None      # a part without bounds


def test_sample_with_bad_sizes_and_nothing_priced(mixed_dir, tmp_path, capsys):
    from nslib.data.serving_sample import serving_rows
    rows = serving_rows()
    priced = rows[rows["reason"] == ""].drop(columns=["gpu", "config", "framework", "reason"])
    bad = priced.head(2).copy()
    bad["isl"] = [np.nan, 0]
    bad.to_csv(tmp_path / "s.csv", index=False)
    got = serving_rows(tmp_path / "s.csv")
    assert (got["reason"] == "missing or bad isl / osl / batch_size / tp_size").all()
    assert main(["eval-serving", "--sample", str(tmp_path / "s.csv")]) == 2
    assert "no row of the sample can be priced" in capsys.readouterr().err


def test_waiting_requests_counts_the_requests_that_wait():
    """Rows differing only in the output length: TTFT = 40 ms + k intervals between
    completions (osl x TPOT / concurrency) gives slope k, per engine and concurrency."""
    import pandas as pd
    from nslib.evaluation.serving_eval import waiting_requests
    rows = []
    for fw, k in (("waits", 1.0), ("flat", 0.0)):
        for c in (8, 16):
            for osl in (128, 256, 512):
                tpot = 5.0 + osl / 256          # any TPOT: the interval uses the measured one
                rows.append(dict(framework=fw, model_path="m", gpu="g", isl=1024,
                                 batch_size=c, tp_size=1, osl=osl, silicon_tpot_ms=tpot,
                                 silicon_ttft_ms=40.0 + k * osl * tpot / c))
    rows.append(dict(rows[0], isl=2048))        # one output length only: no slope
    got = waiting_requests(pd.DataFrame(rows))
    assert list(got["groups"]) == [1, 1, 1, 1]
    assert got.loc[("waits", 8), "median"] == pytest.approx(1.0)
    assert got.loc[("flat", 16), "median"] == pytest.approx(0.0, abs=1e-9)


def test_unseen_predictors_leave_the_gpu_out(data_dir, mixed_dir, monkeypatch):
    """Each learned predictor is trained without the GPU where its data measures it."""
    import nslib.evaluation.serving_eval as se
    from nslib.data.serving_sample import system_gpus
    calls = []

    def fake(name, settings=None, *, kind="fp32", exclude_gpus=()):
        calls.append((kind, tuple(exclude_gpus)))
        return name
    monkeypatch.setattr(se, "trained", fake)
    h100 = system_gpus(["h100_sxm"])["h100_sxm"]
    assert se.unseen_predictors(("nslib", "nslib"), h100, quick=True)[0] == "nslib"
    assert calls == [("gemm", (h100,)), ("attention", (h100,))]   # not an FP32 training GPU
    calls.clear()
    se.unseen_predictors(("nslib", "roofline"), "NVIDIA A100-PCIE-40GB", quick=True)
    assert calls == [("fp32", ("NVIDIA A100-PCIE-40GB",)), ("gemm", ()), ("attention", ())]


def test_eval_serving_held_out(mixed_dir, tmp_path, capsys):
    from nslib.data.serving_sample import serving_rows
    rows = serving_rows()
    keep = rows[(rows["reason"] == "") & (rows["framework"] == "vllm")].head(2)
    keep.drop(columns=["gpu", "config", "framework", "reason"]).to_csv(tmp_path / "s.csv",
                                                                      index=False)
    got = {}
    for flag in ([], ["--held-out"]):
        assert main(["eval-serving", "--sample", str(tmp_path / "s.csv"), "--quick", "--json",
                     *flag]) == 0
        got[bool(flag)] = json.loads(capsys.readouterr().out)
    (key, by_gpu), = ((k, v) for k, v in got[True].items() if k != "unpriced")
    (gpu, held), = by_gpu.items()
    assert held["n"] == 2 and held["ttft_mape"] >= 0
    # the GPU's own kernels trained the default predictors, not the held-out ones
    assert held != got[False][key][gpu]
    assert main(["eval-serving", "--sample", str(tmp_path / "s.csv"), "--quick",
                 "--held-out"]) == 0
    assert "never saw its kernels" in capsys.readouterr().out
