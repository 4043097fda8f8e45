"""Bad inputs get clear errors naming the problem: the probes of issue 14 as tables.

CLI options, Python API arguments, datasheets, kernel CSVs, label files, cache entries and
training parameters. Each row is one probe and the words its message must contain.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest

from nslib import cli
from nslib.cli import commands
from nslib.data.cache import read_cache_entry
from nslib.data.checks import check_float, check_int
from nslib.data.gpus import gpu_from_dict
from nslib.data.paths import CacheError
from nslib.kernels import measured
from nslib.model.step import split_options

SPEC = {"Device": "Test GPU", "Dev_Mem": 80, "Mem_Bw": 3350, "Num_Sm": 132, "Core_Per_SM": 128,
        "Freq": 1980, "SingleFLOPs": 66900, "L2Cache": 50}


def run_cli(argv, capsys) -> tuple[int, str]:
    """(exit code, stderr) of ``nslib argv``; argparse errors exit through SystemExit."""
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


@pytest.fixture
def spec_file(tmp_path):
    def write(name="spec.json", text=None, **fields):
        path = tmp_path / name
        path.write_text(text if text is not None else json.dumps({**SPEC, **fields}))
        return path
    return write


# ---------------------------------------------------------------- numbers
@pytest.mark.parametrize("value,words", [
    (2.5, "must be an integer"), (True, "must be a number"), (float("nan"), "must be an integer"),
    (float("inf"), "must be an integer"), ("2", "must be a number"), (0, "must be positive"),
    (-1, "must be positive"),
])
def test_check_int_rejects(value, words):
    with pytest.raises(ValueError, match=words) as e:
        check_int("batch", value)
    assert "batch" in str(e.value)


def test_check_int_accepts_whole_numbers():
    assert check_int("n", 132.0) == 132 and isinstance(check_int("n", 132.0), int)
    assert check_float("x", 3) == 3.0


@pytest.mark.parametrize("value,kw,words", [
    (float("nan"), {}, "finite"), (float("inf"), {}, "finite"), (-1.0, {"minimum": 0}, ">= 0"),
    (0.0, {"positive": True}, "positive"), (None, {}, "must be a number"),
])
def test_check_float_rejects(value, kw, words):
    with pytest.raises(ValueError, match=words):
        check_float("launch_us", value, **kw)


# ---------------------------------------------------------------- command line
PREDICT = ["predict", "--gpu", "H100", "--model", "gpt2_large", "--batch", "2", "--seq", "64"]


def _with(args, **repl):
    out = list(args)
    for opt, val in repl.items():
        flag = "--" + opt.replace("_", "-")
        if flag in out:
            out[out.index(flag) + 1] = val
        else:
            out += [flag, val]
    return out


@pytest.mark.parametrize("argv,words", [
    (_with(PREDICT, launch_us="nan"), "--launch-us: must be a finite number"),
    (_with(PREDICT, launch_us="inf"), "--launch-us: must be a finite number"),
    (_with(PREDICT, launch_us="-1"), "--launch-us: must be >= 0"),
    (_with(PREDICT, batch="2.5"), "--batch: must be an integer"),
    (_with(PREDICT, batch="0"), "--batch: must be positive"),
    (_with(PREDICT, seq="nan"), "--seq: must be an integer"),
    (_with(PREDICT, dp="1.5"), "--dp: must be an integer"),
    (_with(PREDICT, link_bw="nan"), "--link-bw: must be a finite number"),
    (_with(PREDICT, link_bw="0"), "--link-bw: must be positive"),
    (PREDICT + ["--gpu-spec", "x.json"], "one of --gpu NAME and --gpu-spec FILE, not both"),
    (["train", "--epochs", "0"], "--epochs: must be positive"),
    (["train", "--epochs", "-1"], "--epochs: must be positive"),
    (["train", "--epochs", "2.5"], "--epochs: must be an integer"),
    (["train", "--predictor", "li", "--epochs", "3"], "'li' is not trained in epochs"),
    (["train", "--predictor", "xgboost", "--epochs", "3"], "'xgboost' is not trained in epochs"),
    (["train", "--predictor", "linreg", "--epochs", "3"], "'linreg' is not trained in epochs"),
    (["train", "--predictor", "roofline", "--epochs", "3"], "'roofline' is not trained"),
    (["train", "--all", "--epochs", "3"], "--all trains every predictor"),
    (["eval-kernels", "--seed", "-1"], "--seed: must be an integer >= 0"),
])
def test_cli_bad_options(argv, words, capsys):
    rc, err = run_cli(argv, capsys)
    assert rc == 2 and words in err, err


@pytest.mark.parametrize("case,words", [
    ("directory", "is a directory, not a file"),
    ("infinity", "field 'Mem_Bw' (memory bandwidth, GB/s) must be a finite number"),
    ("nan", "field 'Freq' (boost clock, MHz) must be a finite number"),
    ("half_sm", "field 'Num_Sm' (streaming multiprocessors) must be an integer"),
    ("missing", "GPU spec file not found"),
    ("not_json", "not valid JSON"),
])
def test_cli_bad_gpu_spec(case, words, tmp_path, spec_file, capsys):
    path = {"directory": lambda: (tmp_path / "x.json").mkdir() or tmp_path / "x.json",
            "infinity": lambda: spec_file(text=json.dumps(SPEC).replace("3350", "Infinity")),
            "nan": lambda: spec_file(text=json.dumps(SPEC).replace("1980", "NaN")),
            "half_sm": lambda: spec_file(Num_Sm=0.5),
            "missing": lambda: tmp_path / "absent.txt",
            "not_json": lambda: spec_file("spec.txt", text="Num_Sm = 132")}[case]()
    argv = ["predict", "--gpu-spec", str(path), "--model", "gpt2_large", "--batch", "2",
            "--seq", "64"]
    rc, err = run_cli(argv, capsys)
    assert rc == 2 and words in err and str(path.name) in err, err


def test_spec_path_is_a_path_whatever_its_suffix(spec_file):
    from nslib.model.inputs import resolve_gpu
    path = spec_file("spec.txt")
    assert resolve_gpu(str(path)).name == "Test GPU"
    assert resolve_gpu(path).num_sm == 132


def test_data_and_cache_options_before_or_after_the_subcommand(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NSLIB_DATA", raising=False)
    for argv in (["--data", str(tmp_path / "nowhere"), "gpus"],
                 ["gpus", "--data", str(tmp_path / "nowhere")]):
        rc, err = run_cli(argv, capsys)
        assert rc == 2 and "No NeuSight data at" in err and "nowhere" in err, err
    args = commands.build_parser().parse_args(["--data", "A", "gpus"])
    assert args.data == "A"  # a sub-command without --data keeps the value given before it
    args = commands.build_parser().parse_args(["gpus", "--cache", "C"])
    assert args.cache == "C" and args.data is None


# ---------------------------------------------------------------- Python API
@pytest.mark.parametrize("kw,words", [
    ({"batch": 2.5}, "batch must be an integer"), ({"batch": True}, "batch must be a number"),
    ({"seq": float("nan")}, "seq must be an integer"), ({"batch": 0}, "batch must be positive"),
    ({"launch_us": float("nan")}, "launch_us (microseconds) must be a finite number"),
    ({"launch_us": -2}, "launch_us (microseconds) must be >= 0"),
    ({"dp": 1.5}, "dp must be an integer"), ({"microbatches": 0}, "microbatches must be positive"),
    ({"link": float("inf"), "dp": 2}, "link bandwidth (GB/s) must be a finite number"),
])
def test_predict_model_bad_arguments(kw, words, spec_file):
    from nslib.model.predict import predict_model
    args = {"batch": 2, "seq": 64, **kw}
    launch_us = args.pop("launch_us", 3.0)
    with pytest.raises(ValueError) as e:   # the step, its GPUs or the launch gap says so
        step, par = split_options(**args)
        predict_model(spec_file(), "gpt2_large", step, parallel=par, launch_us=launch_us)
    assert words in str(e.value)


@pytest.mark.parametrize("field,value,words", [
    ("Mem_Bw", math.inf, "must be a finite number"), ("SingleFLOPs", math.nan, "finite"),
    ("Num_Sm", 0.5, "must be an integer"), ("Core_Per_SM", 64.5, "must be an integer"),
    ("Num_Sm", 132.0, None),
])
def test_datasheet_numbers(field, value, words):
    if words is None:
        assert gpu_from_dict({**SPEC, field: value}).num_sm == 132
        return
    with pytest.raises(ValueError, match=words) as e:
        gpu_from_dict({**SPEC, field: value}, source="my.json")
    assert f"my.json: field '{field}'" in str(e.value)


# ---------------------------------------------------------------- data files
@pytest.fixture
def small_data(data_dir, tmp_path, monkeypatch):
    """Data with the real datasheets and one writable test CSV (layernorm), private cache."""
    root = tmp_path / "data_root"
    (root / "data" / "dataset" / "test").mkdir(parents=True)
    (root / "data" / "device_configs").symlink_to(data_dir / "data" / "device_configs")
    src = (data_dir / "data" / "dataset" / "test" / "ln.csv").read_text()
    monkeypatch.setenv("NSLIB_DATA", str(root))
    monkeypatch.setenv("NSLIB_CACHE", str(tmp_path / "cache"))
    measured._cached_table.cache_clear()
    yield root / "data" / "dataset" / "test" / "ln.csv", src
    measured._cached_table.cache_clear()


def _edit_cell(text: str, line: int, col: str, value: str) -> str:
    """``text`` (a CSV, one record per line) with the cell of ``col`` on ``line`` replaced."""
    rows = list(csv.reader(io.StringIO(text)))
    rows[line - 1][rows[0].index(col)] = value
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


@pytest.mark.parametrize("edit,words", [
    (lambda t: t[:-7], "the last line is cut off"),
    (lambda t: _edit_cell(t, 4, "Latency", "fast"), "ln.csv, line 4: column 'Latency' holds "
                                                    "'fast', not a number"),
    (lambda t: _edit_cell(t, 5, "H", ""), "ln.csv, line 5: column 'H' is empty"),
    (lambda t: _edit_cell(t, 3, "Device", ""), "ln.csv, line 3: column 'Device' is empty"),
    (lambda t: t.rstrip("\n") + ",1,2,3\n", "ln.csv"),
    (lambda t: t + "ln,0.5\n", "column"),  # a short row at the end
])
def test_malformed_kernel_csv_names_file_and_line(small_data, edit, words):
    path, src = small_data
    path.write_text(edit(src))
    with pytest.raises(ValueError) as e:
        measured.kernel_table("layernorm", "test")
    assert words in str(e.value) and str(path) in str(e.value)


def test_well_formed_copy_still_reads(small_data):
    path, src = small_data
    path.write_text(src)
    assert len(measured.kernel_table("layernorm", "test")) > 100


@pytest.fixture
def label_data(tmp_path, monkeypatch):
    (tmp_path / "data" / "device_configs").mkdir(parents=True)
    folder = tmp_path / "label" / "GPU_X"
    folder.mkdir(parents=True)
    monkeypatch.setenv("NSLIB_DATA", str(tmp_path))
    return folder


@pytest.mark.parametrize("text,words", [
    ('{"e2e_latency": 1.0,\n "fw_latency": }', "line 2: not a NeuSight label"),
    ('{"e2e_latency": "fast"}', "field 'e2e_latency' must be a number"),
    ('{"e2e_latency": NaN}', "field 'e2e_latency' must be a finite number"),
    ('{"e2e_latency": 2.0, "fw_latency": "x"}', "field 'fw_latency' must be a number"),
    ('{"e2e_latency": 0}', "'e2e_latency' must be positive"),
    ('{"fw_latency": 1.0}', "no e2e_latency"),
    ('[1, 2]', "no e2e_latency"),
])
def test_malformed_label_names_the_file(label_data, text, words):
    from nslib.data.labels import load_labels
    (label_data / "gpt2-inf-512-8.json").write_text(text)
    with pytest.raises(ValueError) as e:
        load_labels()
    assert words in str(e.value) and "gpt2-inf-512-8.json" in str(e.value)


# ---------------------------------------------------------------- cache
def test_damaged_table_is_rebuilt_with_a_note(small_data, capsys):
    path, src = small_data
    path.write_text(src)
    good = measured.kernel_table("layernorm", "test")
    entry = next(Path(os.environ["NSLIB_CACHE"], "tables").glob("layernorm-test-*.parquet"))
    entry.write_bytes(entry.read_bytes()[:100])  # truncated
    measured._cached_table.cache_clear()
    capsys.readouterr()
    again = measured.kernel_table("layernorm", "test")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cached kernel table" in err and "rebuilding" in err
    pd.testing.assert_frame_equal(good, again)
    assert len(pd.read_parquet(entry)) == len(good)  # the entry was rewritten whole


def test_read_cache_entry_notes_and_deletes_a_damaged_entry(tmp_path, capsys):
    bad = tmp_path / "abc.parquet"
    bad.write_bytes(b"PAR1 not really")
    assert read_cache_entry(bad, pd.read_parquet, "model trace") is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cached model trace abc.parquet is damaged" in err
    assert not bad.exists()
    assert read_cache_entry(tmp_path / "absent", pd.read_parquet, "x") is None


def test_unwritable_cache_on_a_miss_is_a_clear_error(small_data, monkeypatch, capsys):
    path, src = small_data
    path.write_text(src)

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr("nslib.data.cache.atomic_write_bytes", refuse)
    with pytest.raises(CacheError, match="cannot write to the cache.*NSLIB_CACHE"):
        measured.kernel_table("layernorm", "test")


def test_unwritable_cache_folder_is_a_clear_error(tmp_path, monkeypatch):
    from nslib.data.paths import cache_dir
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("NSLIB_CACHE", str(blocker))
    with pytest.raises(CacheError, match="cannot write to the cache"):
        cache_dir("tables")
