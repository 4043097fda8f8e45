"""Datasheet range warnings (nslib.predictors.gpu_range): the training GPUs' range comes from the
data, and every prediction path (Python API, CLI text and JSON, sweep) names the figures outside
it."""
import json
import warnings

import pandas as pd
import pytest

from nslib.cli.commands import main
from nslib.data.gpus import find_gpu, load_gpus
from nslib.explore.gpus import hypothetical_gpu
from nslib.predictors.gpu_range import (CHECKED, DatasheetRangeWarning, figures, out_of_range,
                                        range_warnings, training_ranges)
from nslib.model.step import Step

TINY = {"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 4, "vocab_size": 100,
        "n_positions": 64}


@pytest.fixture(scope="module")
def gpus(data_dir):
    return load_gpus()


def test_ranges_come_from_the_training_split(gpus):
    from nslib.kernels.measured import gpu_splits
    r = training_ranges()
    assert r["train_gpus"] == gpu_splits()["train_gpus"]
    sheets = [figures(find_gpu(n, gpus)) for n in r["train_gpus"]]
    for k in CHECKED:
        assert r["ranges"][k] == [min(s[k] for s in sheets), max(s[k] for s in sheets)]
    # every training GPU is inside its own range; the ratio is peak over bandwidth
    assert all(out_of_range(find_gpu(n, gpus)) == [] for n in r["train_gpus"])
    g = find_gpu("H100", gpus)
    assert figures(g)["FLOP/byte"] == pytest.approx(g.peak_gflops / g.mem_bw)


def test_messages_say_which_figure_and_how_far(gpus):
    r = training_ranges()["ranges"]
    base = find_gpu("A100-PCIE-40GB", gpus)          # a training GPU
    big_bw = hypothetical_gpu(base, name="X", mem_bw=22 * r["Mem_Bw"][1])
    lines = range_warnings(big_bw)
    hi = f"{r['Mem_Bw'][1]:,.0f}"
    assert f"X: Mem_Bw {22 * r['Mem_Bw'][1]:,.0f} GB/s is 22x the largest training GPU's " \
           f"({hi} GB/s)" in lines
    # 22x the bandwidth at the same peak also leaves the FLOP/byte range, from below
    assert any(line.startswith("X: FLOP/byte") and "below the smallest" in line
               for line in lines)
    few_sms = hypothetical_gpu(base, name="Y", num_sm=10)
    (o,) = out_of_range(few_sms)
    assert o.figure == "Num_Sm" and not o.above and o.factor == pytest.approx(r["Num_Sm"][0] / 10)


def test_python_api_warns_and_returns_the_lines(data_dir):
    from nslib.model.predict import predict_model
    with pytest.warns(DatasheetRangeWarning) as rec:
        _, s = predict_model("H100", TINY, Step(1, 16, "inf"), "roofline")
    assert [str(w.message).split(": the forecast")[0] for w in rec] == s["warnings"]
    assert any("Mem_Bw" in w for w in s["warnings"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DatasheetRangeWarning)   # a training GPU: silent
        _, s = predict_model("V100", TINY, Step(1, 16, "inf"), "roofline")
    assert s["warnings"] == []


def test_cli_text_and_json_carry_the_warnings(data_dir, capsys):
    args = ["predict", "--gpu", "H100", "--model", "gpt2_large", "--batch", "1", "--seq", "16",
            "--predictor", "roofline"]
    assert main(args) == 0
    err = capsys.readouterr().err   # warnings go to stderr, the report to stdout
    assert "warning: NVIDIA H100 80GB HBM3: SingleFLOPs" in err
    assert main(args + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["warnings"]) >= 3 and any(w.startswith("NVIDIA H100 80GB HBM3: Mem_Bw")
                                             for w in doc["warnings"])


def test_sweep_has_a_warnings_column(data_dir):
    from nslib.model.sweep import sweep
    sc = pd.DataFrame({"gpu": ["H100", "V100"], "batch": [2, 2], "seq": [32, 32]})
    with pytest.warns(DatasheetRangeWarning):
        got = sweep(TINY, "inf", sc, predictor="roofline")
    assert "Mem_Bw" in got.loc[0, "warnings"] and got.loc[1, "warnings"] == ""


def test_range_warnings_once_issues_each_distinct_warning_once():
    import warnings

    from nslib.predictors.gpu_range import DatasheetRangeWarning, range_warnings_once
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with range_warnings_once():
            for _ in range(5):
                warnings.warn("GPU X: Mem_Bw high", DatasheetRangeWarning)
                with warnings.catch_warnings():  # what the tracer does: filters reset
                    warnings.simplefilter("ignore", FutureWarning)
            warnings.warn("GPU Y: L2Cache high", DatasheetRangeWarning)
            warnings.warn("something else", UserWarning)
    messages = [(w.category, str(w.message)) for w in seen]
    assert messages == [(UserWarning, "something else"),
                        (DatasheetRangeWarning, "GPU X: Mem_Bw high"),
                        (DatasheetRangeWarning, "GPU Y: L2Cache high")]
