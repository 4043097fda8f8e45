"""What a new user runs into on a normal day: one GPU registry, models outside the checked
families, flags that do not apply, and what the command line prints."""
from __future__ import annotations

import json
import re
import warnings

import pytest

from nslib.cli import main
from nslib.model.step import Step

H = 32
TINY = dict(model_type="gpt2", n_embd=H, n_layer=1, n_head=2, vocab_size=100, n_positions=64)
LLAMA_GQA = dict(model_type="llama", hidden_size=H, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=4, vocab_size=100,
                 max_position_embeddings=64)
MAMBA = dict(model_type="mamba", hidden_size=H, num_hidden_layers=1, vocab_size=100,
             state_size=4, expand=2, conv_kernel=4)
VIT = dict(model_type="vit", hidden_size=H, num_hidden_layers=1, num_attention_heads=2,
           intermediate_size=64, image_size=32, patch_size=16)
WHISPER = dict(model_type="whisper", d_model=H, encoder_layers=1, decoder_layers=1,
               encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
               decoder_ffn_dim=64, vocab_size=100, num_mel_bins=8, max_source_positions=16,
               max_target_positions=64, pad_token_id=0, bos_token_id=1, eos_token_id=1,
               decoder_start_token_id=1, begin_suppress_tokens=None, suppress_tokens=None)
GEMMA2 = dict(model_type="gemma2", hidden_size=H, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, head_dim=16, intermediate_size=64, vocab_size=100)


def _cfg(tmp_path, config, name="model"):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    return str(path)


# ----- one GPU registry

def test_every_listed_gpu_resolves_by_name(data_dir, mixed_dir, kernelbench_dir, capsys):
    from nslib.data.registry import all_gpus, sources
    from nslib.model.inputs import resolve_gpu
    assert main(["gpus", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {r["data"] for r in listed} == {"neusight", "mixed", "kernelbench"}
    for row in listed:
        assert resolve_gpu(row["key"]).name == row["Device"]
    merged = all_gpus()
    assert set(merged) == {k for s in sources().values() for k in s}
    # the NeuSight H100 lacks Bf16FLOPs; the 16-bit data's copy of it gives the figure
    assert sources()["neusight"]["NVIDIA_H100_80GB_HBM3"].bf16_gflops is None
    assert resolve_gpu("H100").bf16_gflops == merged["NVIDIA_H100_80GB_HBM3"].bf16_gflops > 0


def test_predict_a_16bit_gpu_by_name(data_dir, mixed_dir, tmp_path, capsys):
    # B200 is only in the 16-bit data; H100's Bf16FLOPs only in its 16-bit datasheet
    for gpu in ("B200", "H100"):
        args = ["predict", "--gpu", gpu, "--model", _cfg(tmp_path, LLAMA_GQA), "--batch", "1",
                "--seq", "16", "--dtype", "bf16", "--predictor", "roofline",
                "--tensor-predictor", "roofline", "--json"]
        assert main(args) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["e2e_ms"] > 0 and doc["gpu_name"].startswith("NVIDIA")


def test_links_come_from_the_datasheet_never_the_name():
    import inspect

    from nslib.model.parallel import links
    assert not hasattr(links, "LINK_RULES")
    assert "re.search" not in inspect.getsource(links)


# ----- models

def test_unchecked_family_warns_on_every_call(data_dir):
    from nslib.model.predict import predict_model
    from nslib.model.trace import ModelNoteWarning
    for _ in range(2):  # the second call reads the trace from the cache: still warned
        with pytest.warns(ModelNoteWarning, match="'mamba' is not among the families"):
            _, s = predict_model("V100", MAMBA, Step(1, 8, "inf"), "roofline",
                                 launch_us=None)
        assert "mamba" in s["warnings"][0]


def test_vision_seq_note_on_every_call(data_dir):
    from nslib.model.predict import predict_model
    from nslib.model.trace import ModelNoteWarning
    for _ in range(2):
        with pytest.warns(ModelNoteWarning, match="seq=8 is not used"):
            _, s = predict_model("V100", VIT, Step(1, 8, "inf"), "roofline",
                                 launch_us=None)
        assert any("seq=8 is not used" in w for w in s["warnings"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelNoteWarning)  # seq = patches + 1: nothing to say
        predict_model("V100", VIT, Step(1, 5, "inf"), "roofline", launch_us=None)


def test_whisper_traces_in_16_bits():
    from nslib.model.trace import trace
    tr = trace(WHISPER, Step(1, 8, "inf", dtype="bf16"))
    assert (tr["cls"] == "attention").any()


def test_no_sdpa_in_16_bits_says_what_to_do():
    from nslib.model.trace import trace
    with pytest.raises(ValueError, match="no scaled-dot-product attention.*--dtype fp32") as e:
        trace(GEMMA2, Step(1, 8, "inf", dtype="bf16"))
    assert "Fix the config" not in str(e.value)


def test_imbalance_on_a_dense_model_is_an_error():
    from nslib.model.trace import trace
    with pytest.raises(ValueError, match="imbalance applies to top-k mixture-of-experts"):
        trace(TINY, Step(1, 8, "inf", imbalance=2.0))


def test_tp_must_divide_the_key_value_heads():
    from nslib.model.parallel import check_degrees, model_info
    info = model_info(LLAMA_GQA)
    assert (info["heads"], info["kv_heads"]) == (8, 2)
    check_degrees(info, 4, tp=2)
    with pytest.raises(ValueError, match="2 key/value heads are not divisible by tp=4"):
        check_degrees(info, 4, tp=4)


# ----- the command line

@pytest.mark.parametrize("extra, message", [
    (["--tensor-predictor", "roofline"], "--tensor-predictor prices the 16-bit"),
    (["--optimizer", "sgd"], "--optimizer counts optimizer states"),
    (["--mode", "train", "--kv-cache"], "--kv-cache keeps the keys and values"),
    (["--plain-sum", "--launch-us", "3"], "give one of --plain-sum and --launch-us"),
    (["--microbatches", "2"], "--microbatches splits the batch of a pipeline"),
    (["--imbalance", "2"], "imbalance applies to top-k mixture-of-experts"),
])
def test_flags_that_do_not_apply_are_errors(data_dir, tmp_path, capsys, extra, message):
    args = ["predict", "--gpu", "V100", "--model", _cfg(tmp_path, TINY), "--batch", "1",
            "--seq", "8", "--predictor", "roofline", *extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_text_output_names_the_gpu_units_and_warnings(data_dir, tmp_path, capsys):
    args = ["predict", "--gpu", "H100", "--model", _cfg(tmp_path, MAMBA), "--batch", "1",
            "--seq", "8", "--predictor", "roofline"]
    assert main(args) == 0
    got = capsys.readouterr()
    assert "on NVIDIA H100 80GB HBM3 (" in got.out and " GiB" in got.out
    assert " GB" not in got.out.replace("GB HBM3", "")
    assert "warning" not in got.out                      # every warning goes to stderr ...
    lines = [ln for ln in got.err.splitlines() if ln.startswith("warning: ")]
    assert any("'mamba' is not among" in ln for ln in lines)
    assert any("the forecast extrapolates" in ln for ln in lines)
    assert len(lines) == len(set(lines))                  # ... once, without library lines
    assert ".py:" not in got.err


def test_huge_figures_print_readably(data_dir, tmp_path, capsys):
    args = ["predict", "--gpu", "V100", "--model", _cfg(tmp_path, TINY), "--batch",
            str(10 ** 12), "--seq", "64", "--predictor", "roofline"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "e+" in out and not re.findall(r"\d[\d,.]{15,}", out)  # no 30-digit numbers


def test_a_notebook_run_by_hand_never_rewrites_the_tracked_figures(tmp_path):
    from pathlib import Path

    from nslib.data.paths import figures_dir
    from nslib.viz.scratch import INTERACTIVE, notebook_out
    root = Path(__file__).resolve().parents[1]
    assert notebook_out() == figures_dir() / INTERACTIVE
    assert notebook_out(tmp_path / "x") == tmp_path / "x"
    assert f"figures/{INTERACTIVE}/" in (root / ".gitignore").read_text().split()
    for nb in sorted((root / "notebooks").glob("[0-9]*.py")):
        text = nb.read_text()
        params = text.split('# %% tags=["parameters"]', 1)[1].split("# %%", 1)[0]
        assert "\nout = None" in params, nb.name
        after = text.split('# %% tags=["parameters"]', 1)[1]
        first_save = min(i for i in (after.find("save_figure("), after.find("save_table("))
                         if i >= 0)
        assert 0 <= after.find("out = notebook_out(out)") < first_save, nb.name
