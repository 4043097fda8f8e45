"""Kernels filed by the operator that launched them (nslib.model.operators, the trace's
``call`` column) and the label CSV's nodes classed by what they launch
(nslib.data.reference_graphs.node_classes): the two sides of the per-class comparison."""
from __future__ import annotations

import pandas as pd
import pytest

from nslib.data.reference_graphs import gemm_copies_inside, node_classes
from nslib.model.operators import operator_class, per_operator_class_ms
from nslib.model.trace import trace
from nslib.model.step import Step

GPT2 = dict(model_type="gpt2", n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64,
            bos_token_id=0, eos_token_id=0)


@pytest.fixture(scope="module")
def train():
    return trace(GPT2, Step(2, 16, "train"))


def _ops(df, call):
    return sorted(df.loc[df["call"] == call, "aten"].str.split(".").str[1])


def test_inference_calls(train):
    inf = trace(GPT2, Step(2, 16, "inf"))
    assert (inf["call"] >= 0).all()  # every forward kernel comes from some operator call
    # matmul of q with k transposed: the operand copies run inside the same call as its bmm
    bmm = inf[inf["cls"] == "bmm"]
    for call in bmm["call"]:
        ops = _ops(inf, call)
        assert ops.count("bmm") == 1 and set(ops) <= {"bmm", "clone"}
    assert any("clone" in _ops(inf, c) for c in bmm["call"])


def test_backward_kernels_join_their_forward_call(train):
    fw, bw = train[train["phase"] == "fw"], train[train["phase"] == "bw"]
    # a linear layer's backward: two GEMMs, its bias-gradient sum and the accumulation of its
    # weight and bias gradients, all under the forward addmm's call
    call = int(fw.loc[fw["aten"].str.startswith("aten.addmm"), "call"].iloc[0])
    got = _ops(bw, call)
    assert got.count("mm") == 2 and "sum" in got and got.count("add_") == 2
    # dropout: the forward kernel and its backward (a multiply) share a call
    drop = fw[fw["aten"].str.startswith("aten.native_dropout")]
    assert len(drop)
    for call in drop["call"]:
        assert _ops(bw, call) == ["native_dropout_backward"]
    # the ones gradient the backward starts from belongs to no operator
    assert bw["call"].iloc[0] == -1


def test_operator_class_of_a_trace(train):
    frame = train.assign(kernel_class=train["cls"], pred_ms=train["flops"] + train["bytes"])
    cls = operator_class(frame)
    clones = frame["aten"].str.startswith("aten.clone") & (frame["phase"] == "fw")
    in_matmul = clones & frame["call"].isin(frame.loc[frame["cls"] == "bmm", "call"])
    assert in_matmul.any() and (cls[in_matmul] == "bmm").all()
    drop_bw = frame["aten"].str.startswith("aten.native_dropout_backward")
    assert drop_bw.any() and (cls[drop_bw] == "memory").all()
    # every class total is kept: the operator view only moves milliseconds between classes
    per = per_operator_class_ms(frame)
    assert sum(per.values()) == pytest.approx(frame["pred_ms"].sum())


def test_operator_class_by_hand():
    frame = pd.DataFrame({
        "phase": ["fw", "fw", "fw", "bw", "bw", "fw", "fw", "bw"],
        "call": [0, 0, 1, 1, 0, 2, 3, -1],
        "aten": ["aten.clone.default", "aten.bmm.default", "aten.native_dropout.default",
                 "aten.native_dropout_backward.default", "aten.bmm.default",
                 "aten.where.self", "aten.add.Tensor", "aten.add_.Tensor"],
        "kernel_class": ["memory", "bmm", "memory", "elementwise", "bmm", "memory",
                         "elementwise", "elementwise"],
        "pred_ms": [1.0, 4.0, 2.0, 2.0, 8.0, 1.0, 1.0, 0.5]})
    assert operator_class(frame).tolist() == ["bmm", "bmm", "memory", "memory", "bmm",
                                              "elementwise", "elementwise", "elementwise"]
    assert per_operator_class_ms(frame) == {"bmm": 13.0, "memory": 4.0, "elementwise": 2.5}
    # without calls (e.g. a fused frame) each kernel keeps its class, selects as elementwise
    plain = operator_class(frame.drop(columns="call"))
    assert plain.tolist() == ["memory", "bmm", "memory", "elementwise", "bmm", "elementwise",
                              "elementwise", "elementwise"]


def test_one_dispatch_per_operator_call():
    """Timed on its own, an operator costs its kernels' stream times plus one dispatch (the
    largest microbenchmark-minus-stream gap of its kernels), per phase."""
    frame = pd.DataFrame({"phase": ["fw", "fw", "bw", "fw"], "call": [0, 0, 0, -1],
                          "aten": ["aten.clone.default", "aten.bmm.default", "aten.bmm.default",
                                   "aten.add.Tensor"],
                          "kernel_class": ["memory", "bmm", "bmm", "elementwise"],
                          "pred_ms": [0.010, 0.100, 0.200, 0.003]})
    raw = [0.040, 0.120, 0.230, 0.030]   # gaps 0.030, 0.020 | 0.030 | 0.027
    per = per_operator_class_ms(frame, raw_ms=raw)
    assert per["bmm"] == pytest.approx(0.010 + 0.100 + 0.030 + 0.200 + 0.030)
    assert per["elementwise"] == pytest.approx(0.030)


def _label(rows):
    cols = ["Name", "target", "dtype", "latency", "OpName", "op", "meta", "input_contiguous"]
    return pd.DataFrame(rows, columns=cols)


def test_label_nodes_classed_by_what_they_launch():
    emb = "{'nn_module_stack': OrderedDict([('m', <class 'x.M'>), " \
          "('m.pos', <class 'torch.nn.modules.sparse.Embedding'>)])}"
    drop = "{'nn_module_stack': OrderedDict([('m.drop', " \
           "<class 'torch.nn.modules.dropout.Dropout'>)])}"
    df = _label([
        ["max_1", "<built-in method max of type object at 0x1>", "torch.float32", 2.0, "misc",
         "call_function", "", "[True, True]"],
        ["reshape", "reshape", "torch.float32", 0.1, "misc", "call_method", "", "[False, True]"],
        ["reshape_1", "reshape", "torch.float32", 0.015, "misc", "call_method", "",
         "[True, True]"],
        ["m_pos", "m.pos", "torch.float32", 0.05, "misc", "call_module", emb, "[True]"],
        ["m_drop", "m.drop", "torch.float32", 0.3, "misc", "call_module", drop, "[True]"],
        ["where", "<built-in method where of type object at 0x1>", "torch.float32", 0.4,
         "where", "call_function", "", "[True]"],
        ["contiguous", "contiguous", "torch.float32", 0.1, "contiguous", "call_method", "",
         "[False]"],
        ["contiguous_1", "contiguous", "torch.float32", 0.006, "contiguous", "call_method", "",
         "[True]"],
        ["size", "size", None, 0.01, "misc", "call_method", "", "[True]"],
        ["softmax", "<function softmax at 0x1>", "torch.float32", 1.0, "VECsoftmax",
         "call_function", "", "[True]"],
        ["finfo", "<class 'torch.finfo'>", "torch.float32", 0.01, "misc", "call_function", "",
         "[]"]])
    # a contiguous() of a contiguous tensor returns it: no kernel, a host node
    assert node_classes(df, train=False).tolist() == [
        "elementwise", "memory", "host", "memory", "host", "elementwise", "memory", "host",
        "host", "softmax", "other"]
    # in training, dropout launches its fused kernel: a memory op
    assert node_classes(df, train=True).tolist()[4] == "memory"


def test_gemm_copies_inside_by_the_function_the_graph_calls():
    def graph(*targets):
        return _label([[f"n{i}", t, "torch.float32", 1.0, "BMM", "call_function", "",
                        "[True, False]"] for i, t in enumerate(targets)]
                      + [["c", "contiguous", "torch.float32", 0.1, "contiguous", "call_method",
                          "", "[False]"]])
    bmm = "<built-in method bmm of type object at 0x1>"
    matmul = "<built-in method matmul of type object at 0x1>"
    assert not gemm_copies_inside(graph(bmm, bmm))       # OPT's measured code
    assert gemm_copies_inside(graph(matmul, matmul))     # GPT-2's and BERT's
    assert gemm_copies_inside(graph(bmm, matmul))
    assert gemm_copies_inside(graph())                   # no batched GEMM: nothing to move


def test_gemm_copies_apart_are_memory_operators_of_their_own():
    """Code that copies the operands in separate nodes before a bmm: the trace's copies inside
    the matmul call become memory operators, each timed with its own dispatch."""
    frame = pd.DataFrame({"phase": ["fw", "fw", "fw", "fw", "bw", "bw"],
                          "call": [0, 0, 0, 1, 0, 0],
                          "aten": ["aten.clone.default", "aten.clone.default",
                                   "aten.bmm.default", "aten.clone.default",
                                   "aten.clone.default", "aten.bmm.default"],
                          "kernel_class": ["memory", "memory", "bmm", "memory", "memory", "bmm"],
                          "pred_ms": [0.010, 0.010, 0.100, 0.010, 0.010, 0.200]})
    # gaps 0.030, 0.030, 0.020 | 0.030 | bw: 0.030, 0.010
    raw = [0.040, 0.040, 0.120, 0.040, 0.040, 0.210]
    # the backward copy (making the incoming gradient contiguous) stays with the GEMM
    assert operator_class(frame, gemm_copies=False).tolist() == [
        "memory", "memory", "bmm", "memory", "bmm", "bmm"]
    inside = per_operator_class_ms(frame, raw_ms=raw)
    assert inside["bmm"] == pytest.approx(0.120 + 0.030 + 0.210 + 0.030)
    assert inside["memory"] == pytest.approx(0.040)
    apart = per_operator_class_ms(frame, raw_ms=raw, gemm_copies=False)
    assert apart["bmm"] == pytest.approx(0.120 + 0.210 + 0.030)
    assert apart["memory"] == pytest.approx(3 * 0.040)
    # a select inside the call is no operand copy: it stays with its call
    sel = frame.assign(aten=frame["aten"].where(frame.index != 1, "aten.where.self"))
    assert operator_class(sel, gemm_copies=False).tolist()[:2] == ["memory", "bmm"]
