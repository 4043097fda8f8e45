"""The command line's review fixes: ``nslib serve`` refuses what it cannot forecast (an
encoder, a context past the model's), says n/a for the TPOT of one output token and names
only its own options; ``predict`` and ``serve`` resolve model names alike, check cheap
arguments before tracing, show their defaults, hint at ``nslib calibrate`` and print counts
as whole numbers."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from nslib.cli import main
from nslib.cli.commands import build_parser

HID = 32
LLAMA = dict(model_type="llama", hidden_size=HID, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
             max_position_embeddings=64)
BERT = dict(model_type="bert", hidden_size=HID, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=64, vocab_size=100, max_position_embeddings=64)
VIT = dict(model_type="vit", hidden_size=HID, num_hidden_layers=1, num_attention_heads=2,
           intermediate_size=64, image_size=32, patch_size=16)
# a datasheet without the tensor-core peak (Bf16FLOPs) that serving needs
OLD_GPU = {"Device": "Old GPU", "Dev_Mem": 16, "Mem_Bw": 900, "Num_Sm": 80,
           "Core_Per_SM": 64, "Freq": 1500, "SingleFLOPs": 15000, "L2Cache": 6}
ROOFLINE = ["--predictor", "roofline", "--tensor-predictor", "roofline", "--quick"]


def _file(tmp_path, obj, name) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(obj))
    return str(path)


def _help(command: str) -> str:
    """The help of a sub-command, its whitespace folded (no line breaks to match across)."""
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices
               and command in a.choices)
    return " ".join(sub.choices[command].format_help().split())


# -- 1, 2: serve refuses an encoder and a context past the model's ---------------------------

def test_check_servable_names_the_problem_and_the_fix():
    from nslib.model.serving.steps import check_servable
    check_servable({"causal_lm": True, "architecture": "LlamaForCausalLM"})
    with pytest.raises(ValueError, match="decoder-only causal language model.*"
                                         "BertForSequenceClassification.*nslib predict"):
        check_servable({"causal_lm": False, "architecture": "BertForSequenceClassification"})


@pytest.mark.parametrize("config,arch", [(BERT, "BertForSequenceClassification"),
                                         (VIT, "ViTForImageClassification")])
def test_serve_refuses_an_encoder(data_dir, mixed_dir, tmp_path, capsys, config, arch):
    argv = ["serve", "--model", _file(tmp_path, config, "enc"), "--gpu", "H100", "--isl",
            "16", "--osl", "4", *ROOFLINE]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "causal language model" in err and arch in err and "nslib predict" in err


def test_one_context_check_for_predict_and_serve(data_dir, mixed_dir, tmp_path, capsys):
    from nslib.model.config import check_seq, position_limits
    assert position_limits(LLAMA) == {"max_position_embeddings": 64}
    check_seq({"n_positions": 64}, 64)                     # a full context is allowed
    with pytest.raises(ValueError, match="seq 65 exceeds the model's n_positions = 64"):
        check_seq({"n_positions": 64}, 65)
    cfg = _file(tmp_path, LLAMA, "llama")
    assert main(["serve", "--model", cfg, "--gpu", "H100", "--isl", "60", "--osl", "8",
                 *ROOFLINE]) == 2
    assert ("isl + osl = 68 exceeds the model's max_position_embeddings = 64"
            in capsys.readouterr().err)
    assert main(["predict", "--model", cfg, "--gpu", "H100", "--batch", "1", "--seq", "65",
                 "--predictor", "roofline"]) == 2
    assert "seq 65 exceeds the model's max_position_embeddings = 64" in capsys.readouterr().err


# -- 6: no TPOT with one output token --------------------------------------------------------

def test_serve_one_output_token_has_no_tpot(data_dir, mixed_dir, tmp_path, capsys):
    argv = ["serve", "--model", _file(tmp_path, LLAMA, "llama"), "--gpu", "H100", "--isl",
            "16", "--osl", "1", "--concurrency", "1", "2", *ROOFLINE]
    assert main(argv + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["forecasts"]
    assert [r["tpot_ms"] for r in rows] == [None, None] and rows[0]["ttft_ms"] > 0
    assert main(argv) == 0
    table = capsys.readouterr().out.splitlines()
    head = table.index(next(t for t in table if t.split()[:1] == ["concurrency"]))
    col = table[head].split().index("tpot_ms")
    assert [t.split()[col] for t in table[head + 1:head + 3]] == ["n/a", "n/a"]


def test_serve_says_when_the_engine_keeps_a_request_waiting(data_dir, mixed_dir, tmp_path,
                                                            capsys):
    argv = ["serve", "--model", _file(tmp_path, LLAMA, "llama"), "--gpu", "H100", "--isl",
            "16", "--osl", "4", "--concurrency", "1", "8", *ROOFLINE]
    assert main(argv + ["--framework", "trtllm"]) == 0
    out = capsys.readouterr().out
    assert "trtllm serves all but 1 of the requests" in out and "KV cache holds 1" not in out
    assert main(argv + ["--framework", "trtllm", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["forecasts"]
    assert [r["running"] for r in rows] == [1, 7] and not any(r["kv_bound"] for r in rows)
    assert main(argv + ["--framework", "vllm"]) == 0
    assert "serves all but" not in capsys.readouterr().out


# -- 8: serve's messages name serve's options ------------------------------------------------

def test_serve_errors_name_only_serve_options(data_dir, mixed_dir, tmp_path, capsys):
    cfg = _file(tmp_path, LLAMA, "llama")
    assert main(["serve", "--model", cfg, "--gpu", "no such GPU", *ROOFLINE]) == 2
    err = capsys.readouterr().err
    assert "unknown GPU" in err and "--gpu FILE.json" in err and "--gpu-spec" not in err
    # the names serving can use: those with a tensor-core peak, not the FP32-only ones
    served = err.split("as these have: ")[1]
    assert "NVIDIA_H100_80GB_HBM3" in served and "Tesla_P4" not in served
    assert main(["serve", "--model", cfg, "--gpu", _file(tmp_path, OLD_GPU, "old"),
                 *ROOFLINE]) == 2
    err = capsys.readouterr().err
    assert "Bf16FLOPs" in err and "--gpu FILE.json" in err
    assert "--dtype" not in err and "--gpu-spec" not in err and "fp32" not in err
    # predict keeps naming its own
    assert main(["predict", "--model", cfg, "--gpu", "no such GPU", "--batch", "1", "--seq",
                 "8"]) == 2
    assert "--gpu-spec" in capsys.readouterr().err


# -- 10, 11: one model resolver; tp refused before the model is built ------------------------

def test_predict_takes_the_hf_ids_serve_takes(data_dir, monkeypatch, capsys):
    from nslib.model.config import load_model_config
    from nslib.model.serving import resolve_model
    hf_id = "meta-llama/Llama-3.1-8B-Instruct"
    assert load_model_config(hf_id) == resolve_model(hf_id)
    assert load_model_config(hf_id)["num_attention_heads"] == 32

    def no_build(*a, **k):
        raise AssertionError("the model was built before the cheap checks")
    monkeypatch.setattr("nslib.model.parallel.strategies.model_info", no_build)
    # past the name (no "does not exist"), refused on the config's 32 heads without a build
    assert main(["predict", "--model", hf_id, "--gpu", "H100", "--batch", "1", "--seq", "8",
                 "--tp", "3"]) == 2
    assert "32 heads are not divisible by tp=3" in capsys.readouterr().err
    assert main(["predict", "--model", "gpt2_large", "--gpu", "H100", "--batch", "3", "--seq",
                 "8", "--dp", "2"]) == 2
    assert "batch 3 is not divisible by dp=2" in capsys.readouterr().err


def test_config_heads_reads_what_transformers_reads():
    from nslib.model.parallel.strategies import check_degrees, config_heads
    assert config_heads({"n_head": 20}) == {"heads": 20, "kv_heads": 20}
    assert config_heads(LLAMA) == {"heads": 4, "kv_heads": 2}
    assert config_heads({"encoder_attention_heads": 6}) == {}     # not guessed: built later
    check_degrees({}, 4, tp=3)                        # no sizes: nothing refused yet
    check_degrees({}, 4, pp=5)
    with pytest.raises(ValueError, match="2 key/value heads are not divisible by tp=4"):
        check_degrees(config_heads(LLAMA), 1, tp=4)


# -- 12: help with defaults ------------------------------------------------------------------

def test_help_says_the_defaults():
    serve = _help("serve")
    for text in ("prompt tokens per request (default: 1024)", "(default: 128)",
                 "a sweep) (default: 16)", "tensor-parallel GPUs (default: 1)",
                 "(default: vllm)", "vector-kernel predictor (default: nslib)"):
        assert text in serve
    predict = _help("predict")
    assert "(default: inf)" in predict and "memory kernels) (default: nslib)" in predict
    assert "(default: None)" not in predict + serve and "(default: False)" not in predict
    assert "(default: fp32, the paper's setting)" in predict   # said once, not twice
    assert "an inference forward (--mode inf) or a training step" in predict   # --module's


# -- 13: the hint that calibration enables the intervals -------------------------------------

def test_calibrate_hint_only_where_calibrate_helps(monkeypatch):
    from nslib.cli.intervals import calibrate_hint
    cached: set = set()
    monkeypatch.setattr("nslib.predictors.intervals.calibration",
                        lambda name, data=None, quick=False, **k: name if name in cached else None)
    monkeypatch.setattr("nslib.predictors.intervals.tensor_calibration",
                        lambda name, quick=False, **k: name if "16:" + name in cached else None)
    hint = calibrate_hint("roofline", True)
    assert hint.startswith("note: no 80% interval") and "`nslib calibrate --predictor " \
        "roofline --quick`" in hint and "\n" not in hint
    assert "`nslib calibrate`" in calibrate_hint("nslib", False, "nslib")
    assert calibrate_hint("nslib", False, "roofline") is None  # calibrate would not build it
    cached.update({"nslib", "16:nslib"})
    assert calibrate_hint("nslib", False) is None and calibrate_hint("nslib", False, "nslib") \
        is None


def test_predict_without_calibration_prints_the_hint(data_dir, tmp_path, monkeypatch, capsys):
    for where in ("nslib.predictors.intervals", "nslib.model.predict"):   # none cached
        monkeypatch.setattr(f"{where}.calibration", lambda *a, **k: None)
    assert main(["predict", "--model", _file(tmp_path, LLAMA, "llama"), "--gpu", "V100",
                 "--batch", "1", "--seq", "8", "--predictor", "roofline"]) == 0
    got = capsys.readouterr()
    assert "nslib calibrate --predictor roofline" in got.err and "calibrate" not in got.out


# -- 15: counts whole, latencies fixed -------------------------------------------------------

def test_counts_whole_and_latencies_fixed():
    from nslib.cli.common import fmt_count, fmt_fixed
    from nslib.cli.serving import _table
    assert fmt_count(16.0) == "16" and fmt_count(299518502.0) == "299,518,502"
    assert fmt_fixed(1234567.891) == "1,234,567.89" and fmt_fixed(0.00012, 1) == "0.0"
    assert fmt_fixed(float("nan")) == "n/a"
    frame = pd.DataFrame({"concurrency": [4], "running": [4.0], "ttft_ms": [0.000123],
                          "tpot_ms": [2.5], "latency_ms": [1234567.0],
                          "tokens_per_s": [9876543.21], "tokens_per_s_gpu": [9876543.21]})
    text = _table(frame, 8).to_string(index=False)
    assert "e+" not in text and "e-" not in text and "4.0" not in text
    assert text.split("\n")[1].split() == ["4", "4", "0.0", "2.5", "1,234,567.0",
                                           "9,876,543.2", "9,876,543.2"]


def test_a_name_ambiguous_in_the_first_folder_is_refused_not_guessed(data_dir, mixed_dir):
    """``A100`` names two NeuSight datasheets; the 16-bit data's single A100 must not win."""
    import pytest

    from nslib.data.registry import find_any
    with pytest.raises(KeyError, match="ambiguous"):
        find_any("A100")
    assert find_any("A100 80GB").name == "NVIDIA A100 80GB PCIe"   # unique in NeuSight's
    assert find_any("B200").name == "NVIDIA B200"                  # only in the 16-bit data


def test_serving_warns_of_a_datasheet_beyond_the_training_range(data_dir, mixed_dir):
    """A B200 (148 SMs, 7.7 TB/s) lies beyond every training GPU: serve says so, as predict
    does, once when it prices the model's steps."""
    import warnings

    from nslib.model.serving.forecast import _range_warnings
    from nslib.predictors.gpu_range import DatasheetRangeWarning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _range_warnings("B200")
    texts = [str(w.message) for w in caught if issubclass(w.category, DatasheetRangeWarning)]
    assert texts and all("NVIDIA B200" in t and "extrapolates" in t for t in texts)


def test_module_inputs_take_an_element_type(tmp_path, data_dir, capsys):
    """``--inputs 4x16:int64``: token ids an embedding can take (FP32 inputs cannot index it)."""
    import pytest

    from nslib.model.module_predict import parse_shapes
    ids, x = parse_shapes("4x16:int64,4x8")
    assert ids == (4, 16) and ids.dtype == "int64" and x.dtype == "float32"
    with pytest.raises(ValueError, match="unknown element type 'f16'"):
        parse_shapes("4x16:f16")
    f = tmp_path / "emb.py"
    f.write_text("import torch\nfrom torch import nn\n\n"
                 "class Net(nn.Module):\n"
                 "    def __init__(self):\n"
                 "        super().__init__()\n"
                 "        self.emb = nn.Embedding(1000, 64)\n"
                 "        self.out = nn.Linear(64, 10)\n\n"
                 "    def forward(self, ids):\n"
                 "        return self.out(self.emb(ids))\n")
    assert main(["predict", "--gpu", "V100", "--module", f"{f}:Net", "--inputs", "4x16:int64",
                 "--predictor", "roofline", "--json"]) == 0
    assert '"e2e_ms"' in capsys.readouterr().out
    # FP32 ids: the error names the fix, not only PyTorch's complaint
    assert main(["predict", "--gpu", "V100", "--module", f"{f}:Net", "--inputs", "4x16",
                 "--predictor", "roofline"]) == 2
    assert "8x512:int64" in capsys.readouterr().err


def test_module_input_and_build_errors_name_the_fix(tmp_path, data_dir, capsys):
    """A shape written with commas, a class that needs constructor arguments, a file without
    KernelBench's three names: one line each, saying what to write instead; shapes written
    as on the command line also work from Python."""
    import pytest

    from nslib.model.module_predict import parse_shapes, predict_module
    with pytest.raises(ValueError, match="32x3x224x224"):
        parse_shapes("32,3,224,224")
    assert [s.dtype for s in parse_shapes("4:float32,4:int64")] == ["float32", "int64"]
    f = tmp_path / "mlp.py"
    f.write_text("from torch import nn\n\n"
                 "class MLP(nn.Module):\n"
                 "    def __init__(self, d_in, d_out):\n"
                 "        super().__init__()\n"
                 "        self.fc = nn.Linear(d_in, d_out)\n\n"
                 "    def forward(self, x):\n"
                 "        return self.fc(x)\n\n"
                 "def make():\n"
                 "    return MLP(64, 32)\n")
    assert main(["predict", "--gpu", "V100", "--module", f"{f}:MLP", "--inputs", "8x64"]) == 2
    assert "zero-argument factory" in capsys.readouterr().err
    assert main(["predict", "--gpu", "V100", "--module", str(f), "--inputs", "8x64"]) == 2
    assert f"{f}:MLP --inputs SHAPES" in capsys.readouterr().err
    by_text = predict_module("V100", f"{f}:make", inputs="8x64", predictor="roofline")[1]
    by_tuple = predict_module("V100", f"{f}:make", inputs=[(8, 64)], predictor="roofline")[1]
    assert by_text["e2e_ms"] == by_tuple["e2e_ms"]


def test_predict_writes_the_priced_kernels(tmp_path, data_dir, capsys):
    """``--kernels FILE.csv``: one row per priced kernel whose times add up to the classes'
    sums the summary prints, for a module and for a config."""
    f = tmp_path / "net.py"
    f.write_text("from torch import nn\n\n"
                 "def make():\n"
                 "    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))\n")
    out = tmp_path / "k" / "module.csv"
    assert main(["predict", "--gpu", "V100", "--module", f"{f}:make", "--inputs", "32x64",
                 "--predictor", "roofline", "--json", "--kernels", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    k = pd.read_csv(out)
    assert k["cls"].tolist() == ["linear", "elementwise", "linear"]
    assert k[["M", "N", "K"]].iloc[0].tolist() == [32, 64, 128]
    per_class = k.groupby("cls")["pred_ms"].sum()
    assert per_class.to_dict() == pytest.approx(summary["per_class_ms"])
    out = tmp_path / "config.csv"
    assert main(["predict", "--gpu", "V100", "--model", "gpt2_large", "--batch", "1", "--seq",
                 "64", "--predictor", "roofline", "--kernels", str(out)]) == 0
    k = pd.read_csv(out)
    assert len(k) > 100 and {"module", "pred_ms", "flops"} <= set(k.columns)
    assert main(["predict", "--gpu", "V100", "--model", "gpt2_large", "--batch", "1", "--seq",
                 "64", "--predictor", "roofline", "--kernels", str(tmp_path)]) == 2
    assert "not the folder" in capsys.readouterr().err


def test_a_schedule_says_its_classes_do_not_add_up(data_dir, capsys):
    """Data parallel: the classes count the all-reduce in full, the step only its exposed
    part; the text says what the classes' sum is. One GPU: no such line."""
    base = ["predict", "--gpu", "V100", "--model", "gpt2_large", "--batch", "8", "--seq", "128",
            "--mode", "train", "--predictor", "roofline"]
    assert main(base) == 0
    assert "add up to" not in capsys.readouterr().out
    assert main(base + ["--dp", "4"]) == 0
    assert "every kernel of the step once, communication in full" in capsys.readouterr().out
    # a pipeline's classes are one micro-batch through its stages, and say so
    assert main(base + ["--pp", "2", "--microbatches", "4"]) == 0
    assert "one micro-batch through every stage (the step runs 4)" in capsys.readouterr().out


def test_an_argument_error_is_one_line(capsys):
    """argparse's own checks (a non-positive batch) end in one line naming the command's
    help, not the whole usage block."""
    with pytest.raises(SystemExit) as e:
        main(["predict", "--gpu", "V100", "--model", "gpt2_large", "--batch", "0",
              "--seq", "8"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--batch" in err and "nslib predict --help" in err


@pytest.mark.parametrize("argv,says", [
    (["predict", "--gpu", "V100", "--model", "gpt2_large", "--batch", str(10**20)],
     "argument --batch: must be at most 9,007,199,254,740,992"),
    (["serve", "--model", "gpt2_large", "--gpu", "H100", "--concurrency", str(10**20)],
     "argument --concurrency: must be at most"),
    # checked before any fold trains
    (["calibrate", "--coverage", "1"], "strictly between 0 and 1"),
    (["calibrate", "--coverage", "1.5"], "strictly between 0 and 1"),
])
def test_out_of_range_arguments_are_refused_as_read(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_a_bare_lookup_failure_says_where(monkeypatch, capsys):
    """An internal KeyError (a bare key, not a message) names the key and where it was
    looked up, not only the key."""
    import nslib.cli.commands as commands

    def broken(args):
        return {}["latency_ms"]

    parser = commands.build_parser
    monkeypatch.setattr(commands, "build_parser", lambda: _with_func(parser(), broken))
    assert main(["gpus"]) == 2
    err = capsys.readouterr().err
    assert "no field 'latency_ms' where nslib looked for it (test_cli_review.py, line" in err


def _with_func(parser, func):
    parser.set_defaults(func=func)
    for action in parser._actions:
        for sub in (getattr(action, "choices", None) or {}).values():
            if hasattr(sub, "set_defaults"):
                sub.set_defaults(func=func)
    return parser


def test_options_that_cannot_apply_are_refused(data_dir, mixed_dir, tmp_path, capsys):
    """--kv-cache on an encoder (nothing generates token by token) and serve's --link-bw on
    one GPU (no link to cross) are refused, not ignored."""
    bert, llama = _file(tmp_path, BERT, "bert"), _file(tmp_path, LLAMA, "llama")
    fp32 = ["--batch", "1", "--seq", "8", "--kv-cache", "--predictor", "roofline", "--quick"]
    assert main(["predict", "--gpu", "V100", "--model", bert, *fp32]) == 2
    assert "--kv-cache keeps the keys and values" in capsys.readouterr().err
    assert main(["predict", "--gpu", "V100", "--model", llama, *fp32]) == 0
    capsys.readouterr()
    assert main(["serve", "--model", llama, "--gpu", "H100", "--link-bw", "300",
                 *ROOFLINE]) == 2
    assert "applies with --tp 2 or more" in capsys.readouterr().err


def test_16bit_step_on_a_sheet_without_the_tensor_peak_names_the_one_with_it(data_dir, mixed_dir,
                                                                             capsys):
    # "A100 80GB" is the NeuSight data's PCIe board (no Bf16FLOPs); the 16-bit data's SXM4
    # board answers to the same words and has the figure: the error says so
    assert main(["predict", "--model", "gpt2_large", "--gpu", "A100 80GB", "--dtype", "bf16",
                 "--batch", "1", "--seq", "8"]) == 2
    err = capsys.readouterr().err
    assert "has no 'Bf16FLOPs'" in err and "NVIDIA_A100-SXM4-80GB has it" in err
    assert "--gpu-spec FILE" in err


def test_eval_models_prints_each_warning_once_as_a_line(data_dir, capsys):
    # a datasheet-range note repeats for every label of a GPU: printed once, without the
    # library's file and line
    assert main(["eval-models", "--gpus", "H100", "--predictor", "roofline", "--json"]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines and all(ln.startswith("warning: ") for ln in lines)
    assert len(lines) == len(set(lines)) and "Num_Sm" in err and ".py:" not in err
