"""nslib.evaluation.fusion_eval on a hand-made results frame: every number below is worked out
by hand from the frame, not by the library."""
import pandas as pd

from nslib.evaluation.fusion_eval import (fused_group_counts, fusion_example, fusion_speedups,
                                          fusion_summary, fusion_table)


def results():
    """Two GPUs x two configurations x two predictors, as evaluate_variant("fusion",
    with_base=True) returns them (only the columns the tables read, plus one extra)."""
    rows = []
    for gpu in ("GPU A", "GPU B"):
        for model, batch in (("bert_large", 8), ("gpt2_large", 4)):
            for pred, fused_err, base_err in (("p1", 10.0, 4.0), ("p2", 30.0, 8.0)):
                rows.append({"gpu": gpu, "model": model, "batch": batch, "seq": 512,
                             "tag": f"{model}-{batch}", "config": f"{model} b{batch}",
                             "predictor": pred, "base_e2e_ms": 20.0, "e2e_ms": 16.0,
                             "base_pred_ms": 18.0, "pred_ms": 12.0,
                             "base_err": base_err, "err": fused_err + (gpu == "GPU B"),
                             "note": ""})
    return pd.DataFrame(rows)


def test_fusion_table_renames_and_indexes():
    t = fusion_table(results())
    assert t.index.names == ["gpu", "config", "predictor"]
    assert list(t.columns) == ["measured ms", "measured fused ms", "predicted ms",
                               "predicted fused ms", "error %", "fused error %"]
    row = t.loc[("GPU B", "gpt2_large b4", "p2")]
    assert list(row) == [20.0, 16.0, 18.0, 12.0, 8.0, 31.0]
    assert len(t) == 8


def test_fusion_summary_by_hand():
    s = fusion_summary(results())
    assert list(s.index) == ["p1", "p2"]
    assert list(s.columns) == ["GPU A", "GPU B", "fused (all)", "non-fused (all)"]
    # p1: fused 10 on GPU A, 11 on GPU B (two configs each); non-fused 4 everywhere
    assert s.loc["p1"].tolist() == [10.0, 11.0, 10.5, 4.0]
    assert s.loc["p2"].tolist() == [30.0, 31.0, 30.5, 8.0]


def test_fusion_speedups_by_hand():
    sp = fusion_speedups(results())
    assert (sp["measured"] == 20.0 / 16.0).all() and (sp["predicted"] == 1.5).all()
    assert "note" in sp.columns      # the results' columns are kept


def test_fusion_example_prefers_a_model_other_than_bert():
    r = results()
    assert fusion_example(r)["tag"] == "gpt2_large-4"
    assert fusion_example(r[r["model"] == "bert_large"])["tag"] == "bert_large-8"


def test_fused_group_counts_by_hand():
    trace = pd.DataFrame({"kid": [0, 1, 2, 3, 4, 5, 6, 7],
                          "op": ["linear", "mul", "add", "mul", "add", "softmax", "add", "ln"]})
    # two mul+add groups (200 and 400 bytes), one add+ln group, two kernels left alone
    fused = pd.DataFrame({"kid": [0, 2, 4, 5, 7],
                          "fused_from": [(0,), (1, 2), (3, 4), (5,), (6, 7)],
                          "bytes": [1000.0, 200.0, 400.0, 50.0, 70.0]})
    counts = fused_group_counts(trace, fused)
    assert counts.index.name == "ops"
    assert list(counts.index) == ["mul+add", "add+ln"]
    assert counts.loc["mul+add"].tolist() == [2, 2, 300.0]
    assert counts.loc["add+ln"].tolist() == [1, 2, 70.0]
    assert counts["groups"].sum() == 3


def test_fused_group_counts_without_groups_is_empty():
    trace = pd.DataFrame({"kid": [0, 1], "op": ["linear", "add"]})
    fused = pd.DataFrame({"kid": [0, 1], "fused_from": [(0,), (1,)],
                          "bytes": [1.0, 2.0]})
    assert fused_group_counts(trace, fused).empty
