import json
import subprocess
import sys

import numpy as np
import pandas as pd

from nslib.data.settings import Settings
from nslib.cli.commands import main
from nslib.evaluation import metrics


def test_ape_and_class_table():
    frame = pd.DataFrame({"cls": ["bmm", "bmm", "linear"], "gpu": ["a", "b", "a"],
                          "latency_ms": [1.0, 2.0, 4.0]})
    assert metrics.ape([1.5, 1.0, 4.0], frame["latency_ms"]).tolist() == [50, 50, 0]
    tab = metrics.class_table(frame, [1.5, 1.0, 4.0], ["a"], ["b"])
    assert tab.loc["bmm", "train_gpus"] == 50 and tab.loc["bmm", "new_gpus"] == 50
    assert tab.loc["linear", "train_gpus"] == 0 and np.isnan(tab.loc["linear", "new_gpus"])
    assert metrics.table_json(tab)["linear"] == {"train_gpus": 0.0, "new_gpus": None, "n": 1}


def test_eval_kernels_roofline_json_matches_reference(data_dir, capsys):
    assert main(["eval-kernels", "--predictor", "roofline", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    # reference figures for a roofline on this data (issue 2), training GPUs' test kernels
    ref = {"bmm": 40, "linear": 32, "elementwise": 20, "softmax": 40, "layernorm": 43}
    for cls, want in ref.items():
        assert abs(got[cls]["train_gpus"] - want) < 2, (cls, got[cls])
        assert got[cls]["new_gpus"] is not None and got[cls]["n"] > 0


def test_cli_gpus_and_errors(data_dir, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("NSLIB_DATA", str(data_dir))  # restored after: main() sets it globally
    assert main(["gpus", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert any(r["Device"] == "Tesla T4" for r in rows)
    assert main(["eval-kernels", "--predictor", "nope"]) == 2
    assert "unknown predictor" in capsys.readouterr().err
    assert main(["--data", str(tmp_path), "gpus"]) == 2
    assert "nslib fetch" in capsys.readouterr().err


def test_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "nslib.cli", "predictors"], capture_output=True,
                         text=True, check=True).stdout
    assert "roofline" in out and "nslib" in out


def test_eval_models_json_and_logo_with_the_roofline(data_dir, capsys):
    from nslib.evaluation.model_level import evaluate_models
    args = ["eval-models", "--predictor", "roofline", "--models", "bert_large", "--json"]
    assert main(args) == 0
    got = json.loads(capsys.readouterr().out)["roofline"]
    res = evaluate_models("inf", ["roofline"], models=["bert_large"],
                          settings=Settings(progress=False))
    by_gpu = res.groupby("gpu")["err"].mean()
    assert got["Tesla T4"] == round(by_gpu["Tesla T4"], 4)
    assert got["all"] == round(res["err"].mean(), 4)
    # the roofline is not trained: both protocols give the same figures, training GPUs only
    assert main(args + ["--logo"]) == 0
    logo = json.loads(capsys.readouterr().out)
    paper, held = logo["roofline (paper protocol)"], logo["roofline (leave-one-GPU-out)"]
    assert paper == held and "NVIDIA H100 80GB HBM3" not in held
    assert held["Tesla T4"] == got["Tesla T4"]


def test_eval_models_errors(data_dir, capsys):
    assert main(["eval-models", "--predictor", "nope"]) == 2
    assert "unknown predictor" in capsys.readouterr().err
    # a name no label has is an error naming it, not a smaller table
    assert main(["eval-models", "--predictor", "roofline", "--gpus", "Nowhere GPU"]) == 2
    assert "no labels for GPU 'Nowhere GPU'; GPUs with labels: " in capsys.readouterr().err
    assert main(["eval-models", "--predictor", "roofline", "--gpus", "Tesla_T4", "--models",
                 "gpt2_large", "gpt2_larg"]) == 2
    assert "no labels for model(s) 'gpt2_larg'" in capsys.readouterr().err
    # labelled GPUs and models without labels of the mode asked for
    assert main(["eval-models", "--predictor", "roofline", "--gpus", "Tesla_P4", "--mode",
                 "train"]) == 2
    assert "no train labels" in capsys.readouterr().err
    assert main(["eval-models", "--predictor", "roofline", "--gpus", "NVIDIA_H100_80GB_HBM3",
                 "--logo"]) == 2
    assert "none of them" in capsys.readouterr().err
