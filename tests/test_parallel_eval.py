"""nslib.evaluation.parallel_eval on a hand-made results frame: every number below is worked out
by hand from the frame, not by the library."""
import numpy as np
import pandas as pd
import pytest

from nslib.evaluation.parallel_eval import (parallel_error_table, parallel_summary, parallel_table,
                                            scaling_table, with_strategy)


def results():
    """One GPU, one configuration, three strategies, two predictors, as
    evaluate_variant("distributed", with_base=True) returns them. DP has no single-GPU label
    (NaN), TP and PP do."""
    rows = []
    for kind, micro, base_batch, base_e2e in (("dp", 1, 1, np.nan), ("tp", 1, 4, 100.0),
                                              ("pp", 2, 4, 100.0)):
        for pred, pred_ms, err in (("p1", 44.0, 10.0), ("p2", 60.0, 50.0)):
            rows.append({"gpu": "GPU A", "model": "gpt2_large", "batch": 4,
                         "config": "gpt2_large b4", "kind": kind, "degree": 4,
                         "microbatches": micro, "predictor": pred, "e2e_ms": 40.0,
                         "pred_ms": pred_ms, "err": err + (kind == "pp"), "comm_ms": 5.0,
                         "base_batch": base_batch, "base_e2e_ms": base_e2e,
                         "base_pred_ms": 110.0, "base_err": np.nan if kind == "dp" else 10.0,
                         "note": ""})
    return pd.DataFrame(rows)


def test_with_strategy_names_the_variant():
    r = with_strategy(results())
    assert r["strategy"].tolist() == ["dp4", "dp4", "tp4", "tp4", "pp4_2", "pp4_2"]
    assert "strategy" not in results().columns      # a new frame, the input is left alone


def test_parallel_table_renames_and_indexes():
    t = parallel_table(with_strategy(results()))
    assert t.index.names == ["gpu", "config", "strategy", "predictor"]
    assert list(t.columns) == ["measured ms", "predicted ms", "error %", "predicted comm ms",
                               "1-GPU batch", "1-GPU measured ms", "1-GPU predicted ms",
                               "1-GPU error %"]
    assert t.loc[("GPU A", "gpt2_large b4", "pp4_2", "p2")].tolist() == [
        40.0, 60.0, 51.0, 5.0, 4, 100.0, 110.0, 10.0]


def test_parallel_error_table_layout():
    t = parallel_error_table(with_strategy(results()))
    assert list(t.index) == ["p1", "p2"]
    assert t.columns.names == ["gpu", "config", "strategy"]
    assert t.loc["p1", ("GPU A", "gpt2_large b4", "pp4_2")] == 11.0
    assert t.loc["p2", ("GPU A", "gpt2_large b4", "dp4")] == 50.0


def test_parallel_summary_by_hand():
    s = parallel_summary(with_strategy(results()))
    assert list(s.columns) == ["dp", "pp", "tp", "all", "1-GPU (where labelled)"]
    # p1: dp 10, tp 10, pp 11 -> mean 31 / 3; single-GPU error 10 where labelled (not DP)
    assert s.loc["p1"].tolist() == pytest.approx([10.0, 11.0, 10.0, 31 / 3, 10.0])
    assert s.loc["p2"].tolist() == pytest.approx([50.0, 51.0, 50.0, 151 / 3, 10.0])


def test_scaling_table_by_hand():
    t = scaling_table(with_strategy(results()))
    # DP has no single-GPU label: dropped; TP and PP stay, two predictors each
    assert sorted(set(t.index.get_level_values("strategy"))) == ["pp4_2", "tp4"]
    assert list(t.columns) == ["1-GPU batch", "measured ratio", "predicted ratio",
                               "ratio error %"]
    row = t.loc[("GPU A", "gpt2_large b4", "tp4", "p1")]
    # measured 40 / 100 = 0.4; predicted 44 / 110 = 0.4: no ratio error
    assert row.tolist() == pytest.approx([4, 0.4, 0.4, 0.0])
    row = t.loc[("GPU A", "gpt2_large b4", "tp4", "p2")]
    # predicted 60 / 110 against 0.4: (6 / 11) / 0.4 - 1 = 4 / 11
    assert row["ratio error %"] == pytest.approx(100 * 4 / 11)
