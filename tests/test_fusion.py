"""nslib.model.fusion: which kernels merge, and the bytes/FLOPs of a fused kernel, by hand."""
import numpy as np
import pandas as pd
import pytest

from nslib.model.fusion import fuse, output_bytes
from nslib.model.step import Step

NAN = np.nan


def _row(kid, cls, op, inputs, B=NAN, H=NAN, M=NAN, N=NAN, K=NAN, flops=0.0, nbytes=0.0,
         phase="fw"):
    return {"kid": kid, "phase": phase, "aten": f"aten.{op}", "cls": cls, "op": op, "B": B,
            "M": M, "N": N, "K": K, "H": H, "flops": flops, "bytes": nbytes,
            "inputs": tuple(inputs), "layer": 0, "module": f"m{kid}"}


def _ew(kid, op, inputs, n_in, phase="fw"):
    # 4 rows of 16 elements; bytes 4 * 64 * (inputs + 1), one FLOP per output
    return _row(kid, "elementwise", op, inputs, B=4.0, H=16.0, flops=64.0,
                nbytes=4.0 * 64 * (n_in + 1), phase=phase)


def hand_frame() -> pd.DataFrame:
    """0 GEMM -> 1 mulu -> 2 addu -> 3 add(2, 0) -> 4 softmax -> {5 tanh, 6 copy} -> 7 mul
    -> 8 layernorm -> 9 relu -> {10 mulu, 11 addu}; 12 (backward) reads 10."""
    rows = [
        _row(0, "linear", "linear", (), B=1.0, M=4.0, N=8.0, K=16.0, flops=2 * 4 * 8 * 16.0,
             nbytes=4.0 * (32 + 128 + 64)),
        _ew(1, "mulu", (0,), 1),
        _ew(2, "addu", (1,), 1),
        _ew(3, "add", (2, 0), 2),
        _row(4, "softmax", "softmax", (3,), B=4.0, H=16.0, flops=320.0, nbytes=512.0),
        _ew(5, "tanh", (4,), 1),
        _row(6, "memory", "mem", (4,), B=1.0, H=64.0, nbytes=512.0),
        _ew(7, "mul", (5, 6), 2),
        _row(8, "layernorm", "ln", (7,), B=4.0, H=16.0, flops=384.0, nbytes=512.0),
        _ew(9, "relu", (8,), 1),
        _ew(10, "mulu", (9,), 1),
        _ew(11, "addu", (9,), 1),
        _ew(12, "mulu", (10,), 1, phase="bw"),
    ]
    return pd.DataFrame(rows)


def test_output_bytes_by_class():
    out = output_bytes(hand_frame())
    assert out[0] == 4 * 4 * 16          # GEMM: 4 * B * M * K
    assert out[1] == 256 and out[4] == 256 and out[8] == 256   # vector: 4 * B * H
    assert out[6] == 256                 # memory: min(4 * H, bytes)


def test_fuse_merges_exactly_the_single_consumer_groups():
    df = hand_frame()
    f = fuse(df)
    groups = [tuple(g) for g in f["fused_from"]]
    assert groups == [(0,), (1, 2, 3), (4,), (5, 6, 7), (8,), (9,), (10,), (11,), (12,)]
    # GEMM, softmax and layernorm are never merged with anything
    for kid in (0, 4, 8):
        assert (kid,) in groups
    # 9 has two consumers; 10's only consumer is in another phase: neither is merged
    assert (9,) in groups and (10,) in groups and (12,) in groups
    assert f["kid"].tolist() == list(range(9))
    assert f["phase"].tolist() == ["fw"] * 8 + ["bw"]
    # inputs remapped to the new kids: group (1,2,3) reads the GEMM (new 0), the softmax
    # (new 2) reads it (new 1), group (5,6,7) (new 3) reads the softmax, and so on
    assert f["inputs"].tolist() == [(), (0,), (1,), (2,), (3,), (4,), (5,), (5,), (6,)]
    # unfused rows are unchanged apart from the kid and inputs
    keep = ["cls", "op", "B", "H", "flops", "bytes"]
    pd.testing.assert_frame_equal(f.loc[[0, 2, 4, 5, 6, 7, 8], keep].reset_index(drop=True),
                                  df.loc[[0, 4, 8, 9, 10, 11, 12], keep].reset_index(drop=True))


def test_prologues_merge_into_softmax_and_layernorm():
    f = fuse(hand_frame(), prologues=True)
    groups = [tuple(g) for g in f["fused_from"]]
    # 1-2-3 feed only the softmax, 5-6-7 only the layernorm: each merges into its consumer
    assert groups == [(0,), (1, 2, 3, 4), (5, 6, 7, 8), (9,), (10,), (11,), (12,)]
    sm, ln = f.iloc[1], f.iloc[2]
    # the reduction keeps its class, op and dims, so its own predictor times it
    assert (sm["cls"], sm["op"], sm["B"], sm["H"]) == ("softmax", "softmax", 4.0, 16.0)
    assert (ln["cls"], ln["op"], ln["B"], ln["H"]) == ("layernorm", "ln", 4.0, 16.0)
    assert sm["flops"] == 3 * 64 + 320 and ln["flops"] == 64 + 0 + 64 + 384
    # a GEMM is still never merged, and the reduction's consumers are untouched
    assert (0,) in groups and (9,) in groups


def test_fused_bytes_and_flops_by_hand():
    f = fuse(hand_frame())
    chain, tree = f.iloc[1], f.iloc[3]
    # chain 1 -> 2 -> 3: external input the GEMM output (256 B, read by 1 and by 3 but once),
    # output 256 B; FLOPs 3 * 64. One full-size input -> unary form of the root's add.
    assert chain["bytes"] == 256 + 256
    assert chain["flops"] == 3 * 64
    assert (chain["cls"], chain["op"]) == ("elementwise", "addu")
    assert (chain["B"], chain["H"]) == (4.0, 16.0)   # 512 B / 8 B per output = 64 = 4 x 16
    # tree {5 tanh, 6 copy} -> 7 mul: reads the softmax output once (256 B), writes 256 B
    assert tree["bytes"] == 512 and tree["flops"] == 64 + 0 + 64
    assert (tree["op"], tree["B"] * tree["H"]) == ("mulu", 64.0)
    assert tree["layer"] == 0 and tree["module"] == "m7"       # the root's
    assert tree["aten"].startswith("fused(")


def test_fused_group_with_two_inputs_uses_binary_form():
    rows = [_row(0, "linear", "linear", (), B=1.0, M=4.0, N=8.0, K=16.0, nbytes=900.0),
            _row(1, "linear", "linear", (), B=1.0, M=4.0, N=8.0, K=16.0, nbytes=900.0),
            _ew(2, "mulu", (0,), 1), _ew(3, "add", (2, 1), 2)]
    f = fuse(pd.DataFrame(rows))
    g = f.iloc[2]
    assert g["fused_from"] == (2, 3)
    assert g["bytes"] == 3 * 256 and g["op"] == "add" and g["B"] * g["H"] == 64
    # a memory root is predicted as the copy kernel's add
    rows = [_ew(0, "mulu", (), 1), _row(1, "memory", "mem", (0,), B=1.0, H=64.0, nbytes=512.0)]
    f = fuse(pd.DataFrame(rows))
    assert len(f) == 1 and f.iloc[0]["op"] == "addu" and f.iloc[0]["bytes"] == 256 + 256


def test_fuse_rejects_non_trace_frames():
    with pytest.raises(ValueError, match="missing columns"):
        fuse(pd.DataFrame({"kid": [0]}))


def test_fuse_on_a_traced_gpt2_merges_the_gelu(tmp_path):
    from nslib.model.trace import trace
    cfg = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 64,
           "vocab_size": 300}
    tr = trace(cfg, Step(2, 16, "inf"))
    f = fuse(tr)
    assert len(f) < len(tr)
    gelu = f[f["module"].str.endswith("mlp.act")]
    assert len(gelu) == 2 and gelu["fused_from"].map(len).tolist() == [8, 8]
    # reads the fc1 output once and writes its output: 8 bytes per element of 32 x 256
    assert (gelu["bytes"] == 8 * 32 * 256).all() and (gelu["op"] == "mulu").all()
    # never more bytes than the members moved; every original kernel appears exactly once
    members = sorted(k for g in f["fused_from"] for k in g)
    assert members == tr["kid"].tolist()
    src = tr.set_index("kid")
    for _, r in f[f["fused_from"].map(len) > 1].iterrows():
        assert r["bytes"] <= src.loc[list(r["fused_from"]), "bytes"].sum()
        assert set(src.loc[list(r["fused_from"]), "cls"]) <= {"elementwise", "memory"}
