"""Model-level prediction: summaries, CLI, custom GPUs, caches, sweeps, labels."""
import json

import pandas as pd
import pytest

from nslib.cli.commands import main
from nslib.data.labels import load_labels, parse_tag
from nslib.model.inputs import traced
from nslib.model.predict import predict_model
from nslib.model.sweep import sweep
from nslib.model.step import Step

TINY = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100,
        "n_positions": 64, "architectures": ["GPT2LMHeadModel"]}


def test_predict_model_summary_adds_up(data_dir):
    frame, s = predict_model("V100", TINY, Step(2, 16, "train"), "roofline")
    assert s["e2e_ms"] == pytest.approx(s["fw_ms"] + s["bw_ms"])
    assert s["e2e_ms"] == pytest.approx(frame["pred_ms"].sum())
    assert sum(s["per_class_ms"].values()) == pytest.approx(s["e2e_ms"])
    assert s["bw_ms"] > s["fw_ms"] > 0
    _, inf = predict_model("V100", TINY, Step(2, 16, "inf"), "roofline")
    assert inf["bw_ms"] == 0 and inf["fw_ms"] > 0


def test_faster_gpu_spec_is_faster_under_the_roofline(data_dir, tmp_path):
    spec = {"Device": "Fantasy GPU", "Dev_Mem": 32, "Mem_Bw": 1800, "Num_Sm": 160,
            "Core_Per_SM": 64, "Freq": 1370, "SingleFLOPs": 28058, "L2Cache": 12}
    path = tmp_path / "fantasy.json"
    path.write_text(json.dumps(spec))
    _, fast = predict_model(str(path), "gpt2_large", Step(1, 128, "inf"), "roofline",
                            launch_us=None)
    _, base = predict_model("V100", "gpt2_large", Step(1, 128, "inf"), "roofline",
                            launch_us=None)
    assert fast["e2e_ms"] == pytest.approx(base["e2e_ms"] / 2, rel=1e-6)


def test_bad_inputs_are_clear_errors(data_dir):
    with pytest.raises(KeyError, match="unknown GPU"):
        predict_model("RTX 9090", TINY, Step(1, 8, "inf"), "roofline")
    with pytest.raises(ValueError, match="mode"):
        predict_model("V100", TINY, Step(1, 8, "backprop"), "roofline")
    with pytest.raises(ValueError):
        predict_model("V100", TINY, Step(0, 8, "inf"), "roofline")


def test_cli_predict_json(data_dir, capsys):
    assert main(["predict", "--gpu", "H100", "--model", "bert_large", "--batch", "2",
                 "--seq", "128", "--mode", "train", "--predictor", "roofline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"e2e_ms", "fw_ms", "bw_ms", "per_class_ms"} <= set(out)
    assert out["per_class_ms"]["linear"] > 0
    assert main(["predict", "--model", "bert_large", "--batch", "2", "--seq", "128"]) == 2
    assert "--gpu" in capsys.readouterr().err


def test_trace_cache_returns_the_same_frame(data_dir):
    a = traced(TINY, 2, 16, "train")
    b = traced(TINY, 2, 16, "train")
    pd.testing.assert_frame_equal(a, b)


def test_sweep_matches_per_scenario_prediction(data_dir):
    sc = pd.DataFrame({"gpu": ["H100", "T4", "V100"], "batch": [4, 1, 2], "seq": [48, 16, 32]})
    got = sweep(TINY, "train", sc, predictor="roofline")
    for i, r in sc.iterrows():
        _, s = predict_model(r["gpu"], TINY, Step(r["batch"], r["seq"], "train"), "roofline")
        assert got.loc[i, "e2e_ms"] == pytest.approx(s["e2e_ms"], rel=0.01)


def test_labels_load_and_parse(data_dir):
    assert parse_tag("gpt3_xl-train-2048-4-pp4_1") == {
        "model": "gpt3_xl", "mode": "train", "seq": 2048, "batch": 4, "variant": "pp4_1"}
    with pytest.raises(ValueError, match="not <model>"):
        parse_tag("weird")
    lab = load_labels()
    assert (lab["e2e_ms"] > 0).all() and {"inf", "train"} == set(lab["mode"])
