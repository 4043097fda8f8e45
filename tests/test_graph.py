"""nslib.model.trace: tracing HuggingFace configs into kernels. Expected numbers are hand
arithmetic."""
from __future__ import annotations

import json
import warnings
from collections import Counter

import numpy as np
import pytest

from nslib.model import aten
from nslib.model.config import load_model_config
from nslib.model.trace import MEMORY_COLUMNS, TRACE_COLUMNS, summarize, trace
from nslib.model.step import Step

# tiny GPT-2: 2 layers, width 64, 4 heads (head dim 16), vocab 100
GPT2 = dict(model_type="gpt2", n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64,
            bos_token_id=0, eos_token_id=0)
BATCH, SEQ = 2, 16
TOK = BATCH * SEQ  # 32 rows in every linear

# per layer, forward, in launch order: c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj as (M, N, K)
LAYER_LINEARS = [(TOK, 64, 192), (TOK, 64, 64), (TOK, 64, 256), (TOK, 256, 64)]
LM_HEAD = (TOK, 64, 100)
# QK^T: (batch*heads, seq, head_dim, seq); AV: (batch*heads, seq, seq, head_dim)
QK, AV = (8, 16, 16, 16), (8, 16, 16, 16)

# 2*M*N*K: c_attn 786432, c_proj 262144, c_fc 1048576, mlp c_proj 1048576 -> 3145728 per layer
# bmm: 2*8*16*16*16 = 65536 each, two per layer -> 131072; lm head 2*32*64*100 = 409600
FW_GEMM_FLOPS = 2 * (3_145_728 + 131_072) + 409_600
assert FW_GEMM_FLOPS == 6_963_200


def gemm_dims(df, phase, cls):
    sel = df[(df["phase"] == phase) & (df["cls"] == cls)]
    cols = ["B", "M", "N", "K"] if cls == "bmm" else ["M", "N", "K"]
    return [tuple(int(v) for v in r) for r in sel[cols].to_numpy()]


@pytest.fixture(scope="module")
def gpt2_inf():
    return trace(GPT2, Step(BATCH, SEQ, "inf"))


@pytest.fixture(scope="module")
def gpt2_train():
    return trace(GPT2, Step(BATCH, SEQ, "train"))


def test_columns_and_dtypes(gpt2_inf):
    df = gpt2_inf
    assert list(df.columns) == list(TRACE_COLUMNS) + list(MEMORY_COLUMNS)
    assert df["kid"].tolist() == list(range(len(df)))
    for c in ("B", "M", "N", "K", "H", "flops", "bytes"):
        assert df[c].dtype == np.float64
    assert set(df["phase"]) == {"fw"}
    assert set(df["cls"]) <= {"bmm", "linear", "elementwise", "softmax", "layernorm", "memory"}
    gemm = df["cls"].isin(["bmm", "linear"])
    assert df.loc[gemm, "H"].isna().all() and df.loc[~gemm, ["M", "N", "K"]].isna().all().all()
    assert (df.loc[df["cls"] == "linear", "B"] == 1).all()
    assert (df.loc[df["cls"] == "memory", "op"] == "mem").all()
    assert (df.loc[df["cls"] == "memory", "B"] == 1).all()
    assert (df["bytes"] > 0).all()


def test_inference_gemms_by_hand(gpt2_inf):
    df = gpt2_inf
    assert gemm_dims(df, "fw", "linear") == LAYER_LINEARS * 2 + [LM_HEAD]
    assert gemm_dims(df, "fw", "bmm") == [QK, AV] * 2
    gemm = df[df["cls"].isin(["bmm", "linear"])]
    assert gemm["flops"].sum() == FW_GEMM_FLOPS
    # bytes of c_attn: 4 * (32*64 + 64*192 + 32*192)
    first = gemm.iloc[0]
    assert first["bytes"] == 4 * (32 * 64 + 64 * 192 + 32 * 192)
    lin = df[df["cls"] == "linear"]
    assert lin["module"].tolist() == [
        f"transformer.h.{i}.{m}" for i in range(2)
        for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")] + ["lm_head"]
    assert lin["layer"].tolist() == [0] * 4 + [1] * 4 + [-1]
    assert set(df.loc[df["cls"] == "bmm", "layer"]) == {0, 1}


def test_inference_vector_ops(gpt2_inf):
    df = gpt2_inf
    ln = df[df["cls"] == "layernorm"]
    assert len(ln) == 5 and (ln["op"] == "ln").all()          # ln_1, ln_2 per layer + ln_f
    assert ln[["B", "H"]].drop_duplicates().to_numpy().tolist() == [[32, 64]]
    sm = df[df["cls"] == "softmax"]
    assert len(sm) == 2 and sm[["B", "H"]].to_numpy().tolist() == [[128, 16]] * 2
    assert sm["flops"].tolist() == [128 * 16 * 5] * 2
    ew = df[(df["cls"] == "elementwise") & (df["layer"] == 0)]
    # gelu_new 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))) on (32, 256): 8 kernels, the
    # scalings 0.5*x, 0.044715*x^3, sqrt(2/pi)*(.) are mulu, x^3 powu, 1+t addu
    gelu = ew[ew["module"] == "transformer.h.0.mlp.act"]
    assert Counter(gelu["op"]) == Counter({"mulu": 3, "powu": 1, "add": 1, "tanh": 1,
                                           "addu": 1, "mul": 1})
    assert (gelu[["B", "H"]].to_numpy() == [32, 256]).all()
    tanh = gelu[gelu["op"] == "tanh"].iloc[0]
    assert tanh["flops"] == 32 * 256 and tanh["bytes"] == 32 * 256 * 8
    # no dropout in inference
    assert not df["aten"].str.contains("dropout").any()


def test_training_gemms_by_hand(gpt2_train):
    df = gpt2_train
    assert gemm_dims(df, "fw", "linear") == LAYER_LINEARS * 2 + [LM_HEAD]
    bw_lin = Counter(gemm_dims(df, "bw", "linear"))
    # every linear needs its input and its weight gradient: for y = x(M x N) @ W(N x K),
    # dX = dY(M x K) @ W^T -> (M, K, N) and dW = X^T(N x M) @ dY -> (N, M, K);
    # the LM head is x @ W^T with W (100 x 64): dX (32, 100, 64), dW = dY^T @ x (100, 32, 64)
    want = Counter()
    for (m, n, k) in LAYER_LINEARS * 2:
        want[(m, k, n)] += 1
        want[(n, m, k)] += 1
    want[(32, 100, 64)] += 1
    want[(100, 32, 64)] += 1
    assert bw_lin == want
    assert len(gemm_dims(df, "bw", "bmm")) == 8                # 2 per forward bmm
    fw = df.loc[(df["phase"] == "fw") & df["cls"].isin(["bmm", "linear"]), "flops"].sum()
    bw = df.loc[(df["phase"] == "bw") & df["cls"].isin(["bmm", "linear"]), "flops"].sum()
    assert fw == FW_GEMM_FLOPS
    assert bw == 2 * FW_GEMM_FLOPS == 13_926_400


def test_training_bmm_backward_shapes():
    # seq 8 separates the dims: QK^T (8, 8, 16, 8), AV (8, 8, 8, 16); for bmm(a (B,M,N),
    # b (B,N,K)): da = dC @ b^T -> (B, M, K, N), db = a^T @ dC -> (B, N, M, K)
    df = trace(GPT2, Step(2, 8, "train"))
    assert gemm_dims(df, "fw", "bmm") == [(8, 8, 16, 8), (8, 8, 8, 16)] * 2
    want = Counter({(8, 8, 8, 16): 2, (8, 16, 8, 8): 1, (8, 8, 16, 8): 1})
    want = Counter({k: 2 * v for k, v in want.items()})
    assert Counter(gemm_dims(df, "bw", "bmm")) == want


def test_training_other_ops(gpt2_train):
    df = gpt2_train
    fw, bw = df[df["phase"] == "fw"], df[df["phase"] == "bw"]
    assert fw["kid"].max() < bw["kid"].min()
    # dropout as CUDA runs it: fused native_dropout forward (memory), masked scale backward (mul)
    drop_fw = fw[fw["aten"] == "aten.native_dropout.default"]
    assert len(drop_fw) == 7 and (drop_fw["cls"] == "memory").all()  # embd + 3 per layer
    drop_bw = bw[bw["aten"] == "aten.native_dropout_backward.default"]
    assert len(drop_bw) == 7 and (drop_bw["op"] == "mul").all()
    assert not df["aten"].str.contains("bernoulli").any()
    # layer norm backward: an input-grad row and a weight/bias-grad row, both layer norm
    lnb = bw[bw["aten"] == "aten.native_layer_norm_backward.default"]
    assert Counter(lnb["op"]) == Counter({"ln_bw": 5, "ln_wgrad": 5})
    assert (lnb["cls"] == "layernorm").all()
    wg = lnb[lnb["op"] == "ln_wgrad"]  # reads dY and X, writes weight and bias grads
    assert (wg["bytes"] == 4 * (2 * wg["B"] * wg["H"] + 2 * wg["H"])).all()
    # the input-grad kernels read the output gradient and the input and write one tensor:
    # 3 x B x H x 4 bytes (the forward moves 2x); softmax backward likewise
    ln_dx = lnb[lnb["op"] == "ln_bw"]
    assert (ln_dx["op"] == "ln_bw").all()
    assert (ln_dx["bytes"] == 3 * ln_dx["B"] * ln_dx["H"] * 4).all()
    smb = bw[bw["cls"] == "softmax"]
    assert len(smb) == 2 and (smb["op"] == "softmax_bw").all()  # one per layer
    assert (smb["bytes"] == 3 * smb["B"] * smb["H"] * 4).all()
    smf = fw[fw["cls"] == "softmax"]
    assert (smf["op"] == "softmax").all() and (smf["bytes"] == 2 * smf["B"] * smf["H"] * 4).all()
    # ... after PyTorch's CUDA softmax backward has multiplied the gradient by the output in
    # an elementwise kernel of its own (same call, same B x H; the row kernel reads its result)
    sm_call = bw[bw["aten"] == "aten._softmax_backward_data.default"]
    assert list(sm_call["op"]) == ["mul", "softmax_bw"] * 2
    mul = sm_call[sm_call["op"] == "mul"]
    assert (mul["cls"] == "elementwise").all()
    assert (mul["bytes"] == 3 * mul["B"] * mul["H"] * 4).all()
    assert (mul[["B", "H"]].to_numpy() == smb[["B", "H"]].to_numpy()).all()
    # the row kernel reads the product and, again, the forward's output (its softmax row)
    fw_kids = set(smf["kid"])
    assert all(len(inp) == 2 and k in inp and (set(inp) - {k}) <= fw_kids
               for inp, k in zip(smb["inputs"], mul["kid"]))
    assert all(any(i in fw_kids for i in inp) for inp in mul["inputs"])
    # the product is a buffer of its own: allocated at the multiply, freed after the row kernel
    for (_, m), k in zip(mul.iterrows(), smb["kid"]):
        size = m["B"] * m["H"] * 4
        assert size in m["allocs"] and m["frees"][m["allocs"].index(size)] == k
    # gradient accumulation: one add_ per parameter tensor, 12 per layer + wte, wpe, ln_f w, b
    acc = bw[bw["aten"] == "aten.add_.Tensor"]
    assert len(acc) == 2 * 12 + 4 and (acc["op"] == "add").all()
    no_acc = trace(GPT2, Step(BATCH, SEQ, "train"), grad_accumulation=False)
    assert (no_acc["aten"] == "aten.add_.Tensor").sum() == 0
    assert (bw["layer"].isin([-1, 0, 1])).all()
    assert set(bw.loc[bw["cls"] == "linear", "layer"]) == {-1, 0, 1}


def test_inputs_edges(gpt2_train):
    df = gpt2_train
    for kid, inputs in zip(df["kid"], df["inputs"]):
        assert isinstance(inputs, tuple)
        assert all(0 <= k < kid for k in inputs)
    fw = df[df["phase"] == "fw"]

    def kid_of(module, frame=fw):
        return frame.loc[frame["module"] == module, "kid"].iloc[0]

    # c_attn reads ln_1's output; c_fc reads ln_2's output (through reshapes: no kernel)
    ln1, ln2 = kid_of("transformer.h.0.ln_1"), kid_of("transformer.h.0.ln_2")
    assert fw.loc[fw["module"] == "transformer.h.0.attn.c_attn", "inputs"].iloc[0] == (ln1,)
    assert fw.loc[fw["module"] == "transformer.h.0.mlp.c_fc", "inputs"].iloc[0] == (ln2,)
    # the weight gradient of c_fc, (64, 32, 256), reads the saved ln_2 output and a gradient
    bw = df[(df["phase"] == "bw") & (df["module"] == "transformer.h.0.mlp.c_fc")
            & (df["cls"] == "linear") & (df["M"] == 64)]
    assert len(bw) == 1 and ln2 in bw["inputs"].iloc[0] and len(bw["inputs"].iloc[0]) == 2
    # the first embedding lookup reads only model inputs and parameters
    assert df["inputs"].iloc[0] == ()
    assert (df["inputs"].map(len) > 0).mean() > 0.9


def test_deterministic(gpt2_inf):
    again = trace(dict(GPT2), Step(BATCH, SEQ, "inf"))
    assert again.equals(gpt2_inf)


def test_unknown_op_warns(monkeypatch):
    monkeypatch.delitem(aten.EW_FIXED, "tanh")
    with pytest.warns(UserWarning, match=r"aten\.tanh\.default x2"):
        df = trace(GPT2, Step(BATCH, SEQ, "inf"))
    assert not (df["aten"] == "aten.tanh.default").any()
    assert len(df) > 0


def test_no_warning_for_known_models():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace(GPT2, Step(BATCH, SEQ, "train"))


@pytest.mark.parametrize("cfg, match", [
    (dict(GPT2, n_embd=66), "cannot build"),
    (dict(model_type="no_such_model", hidden_size=8), "model_type"),
    ({"n_layer": 2}, "model_type"),
])
def test_bad_config(cfg, match):
    with pytest.raises(ValueError, match=match):
        trace(cfg, Step(BATCH, SEQ, "inf"))


@pytest.mark.parametrize("batch, seq, mode", [(0, 16, "inf"), (-1, 16, "inf"), (2.5, 16, "inf"),
                                              (True, 16, "inf"), (2, 0, "inf"),
                                              (2, 16, "forward"), (2, 65, "inf")])
def test_bad_arguments(batch, seq, mode):
    with pytest.raises(ValueError):
        trace(GPT2, Step(batch, seq, mode))


BERT = dict(model_type="bert", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
            intermediate_size=128, vocab_size=100, max_position_embeddings=64, pad_token_id=0)


def test_tiny_bert():
    inf = trace(BERT, Step(2, 16, "inf"))
    # per layer q, k, v, attention output, intermediate, output: (M, N, K)
    layer = [(32, 64, 64)] * 4 + [(32, 64, 128), (32, 128, 64)]
    # BertForSequenceClassification (as measured): pooler (2, 64, 64), classifier (2, 64, 2)
    assert gemm_dims(inf, "fw", "linear") == layer * 2 + [(2, 64, 64), (2, 64, 2)]
    assert gemm_dims(inf, "fw", "bmm") == [(8, 16, 16, 16)] * 4
    assert (inf["cls"] == "layernorm").sum() == 5
    assert set(inf.loc[inf["cls"] == "bmm", "layer"]) == {0, 1}
    assert inf.loc[inf["cls"] == "bmm", "module"].str.startswith("bert.encoder.layer.").all()
    train = trace(BERT, Step(2, 16, "train"))
    # BertForPreTraining: pooler, MLM transform (32, 64, 64), decoder (32, 64, 100), NSP
    assert gemm_dims(train, "fw", "linear") == layer * 2 + [(2, 64, 64), (32, 64, 64),
                                                          (32, 64, 100), (2, 64, 2)]
    assert len(gemm_dims(train, "bw", "linear")) == 2 * 16


SWITCH = dict(model_type="switch_transformers", d_model=32, d_ff=64, d_kv=8, num_heads=4,
              num_layers=2, num_decoder_layers=2, num_sparse_encoder_layers=1,
              num_sparse_decoder_layers=1, encoder_sparse_step=2, decoder_sparse_step=2,
              num_experts=3, expert_capacity=4, vocab_size=50, is_encoder_decoder=True,
              feed_forward_proj="relu", dense_act_fn="relu", router_bias=False)


def test_tiny_switch_fixed_capacity():
    df = trace(SWITCH, Step(2, 16, "train"))
    fw = df[(df["phase"] == "fw") & (df["cls"] == "linear")]
    experts = fw[fw["module"].str.contains(r"experts\.expert_\d+\.wi$")]
    # one sparse block per stack, 3 experts each, capacity 4 tokens per batch row of 2
    assert len(experts) == 2 * 3
    assert experts[["M", "N", "K"]].drop_duplicates().to_numpy().tolist() == [[8, 32, 64]]
    router = fw[fw["module"].str.endswith("router.classifier")]
    assert router[["M", "N", "K"]].to_numpy().tolist() == [[32, 32, 3]] * 2
    # encoder blocks are layers 0, 1 and decoder blocks 2, 3
    assert set(df["layer"]) == {-1, 0, 1, 2, 3}
    assert (df[df["module"].str.startswith("decoder.block.0.")]["layer"] == 2).all()


def test_summarize(gpt2_train):
    s = summarize(gpt2_train)
    assert list(s.columns) == ["phase", "cls", "kernels", "gemm_flops", "flops", "bytes"]
    assert s["kernels"].sum() == len(gpt2_train)
    fw_gemm = s[(s["phase"] == "fw")]["gemm_flops"].sum()
    assert fw_gemm == FW_GEMM_FLOPS
    assert s.loc[(s["phase"] == "fw") & (s["cls"] == "linear"), "kernels"].item() == 9
    assert s["phase"].tolist()[0] == "fw" and s["phase"].tolist()[-1] == "bw"


def test_load_model_config(tmp_path):
    assert load_model_config(GPT2) == GPT2 and load_model_config(GPT2) is not GPT2
    good = tmp_path / "m.json"
    good.write_text(json.dumps(GPT2))
    assert load_model_config(good) == GPT2
    bad = tmp_path / "bad.json"
    bad.write_text("{\"model_type\": \"gpt2\",")
    with pytest.raises(ValueError, match="bad.json"):
        load_model_config(bad)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        load_model_config(tmp_path / "missing.json")
    lst = tmp_path / "list.json"
    lst.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        load_model_config(lst)


def test_load_model_config_by_name(data_dir):
    root = data_dir
    cfg = load_model_config("gpt3_27", data=root)
    assert cfg["model_type"] == "gpt2" and cfg["n_embd"] == 2560
    with pytest.raises(FileNotFoundError, match="no_such_config"):
        load_model_config("no_such_config", data=root)
