"""`nslib collect` on the CPU (the harness the GPU runs, wall-clock timings, a tiny budget):
its files load through nslib's own readers unchanged, a rerun resumes without repeating rows,
the collection drops into a copy of the data and flows through the kernel and model checks."""
import json
import shutil

import pandas as pd
import pytest

from nslib.cli import main
from nslib.data import labels, mixed_data
from nslib.evaluation.collect import layout
from nslib.evaluation.collect.sheet import datasheet, lanes_per_sm
from nslib.evaluation.collect.steps import parse_step
from nslib.evaluation.collect.timing import _parse_events, fastest_mean
from nslib.kernels import measured, sizes

STEPS = "bert:inf:32:1,bert:train:32:1"


@pytest.fixture(scope="module")
def collected(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("collect") / "cpu"
    assert main(["collect", "--device", "cpu", "--minutes", "1", "--out", str(out),
                 "--parts", "fp32,tensor", "--json"]) == 0
    # the model steps in a run of their own (a resumed collection), so a loaded machine's
    # slow kernels cannot eat their share
    assert main(["collect", "--device", "cpu", "--minutes", "0.5", "--out", str(out),
                 "--parts", "models", "--models", STEPS, "--json"]) == 0
    return out


def test_kernel_csvs_read_by_nslib(collected):
    rec = json.loads((collected / "provenance.json").read_text())
    first = (rec.get("earlier_runs") or [rec])[0]
    assert rec["versions"]["torch"] and first["parts"]["fp32"]["rows"] > 0
    for cls in sizes.CLASSES:
        path = layout.kernel_csv(collected, cls)
        if not path.is_file():
            continue
        cols = layout.GEMM_COLUMNS if cls in sizes.GEMM_CLASSES else layout.VEC_COLUMNS
        assert list(pd.read_csv(path).columns) == cols  # NeuSight's columns, in order
        raw = measured._read(path, cls)  # the reader's own checks: columns, numbers, no gaps
        assert (raw["latency_ms"] > 0).all() and (raw["gpu"] == rec["device"]).all()
    vec = measured.build_table("elementwise", "test", layout.asplos(collected))
    assert len(vec) and vec["gpu"].nunique() == 1 and vec["num_sm"].iloc[0] >= 1


def test_tensor_tables_and_labels_read_by_nslib(collected):
    root = collected / layout.MIXED
    gemm = mixed_data.gemm_table(root)
    assert len(gemm) and (gemm["latency_ms"] > 0).all()
    att = mixed_data.attention_table(root)
    assert set(att["phase"]) <= {"prefill", "decode"}
    lab = labels.load_labels(layout.asplos(collected))
    assert set(lab["tag"]) == {"bert-inf-32-1", "bert-train-32-1"}
    train = lab.set_index("tag").loc["bert-train-32-1"]
    assert train["bw_ms"] > 0 and abs(train["fw_ms"] + train["bw_ms"] - train["e2e_ms"]) < 1e-6


def test_rerun_resumes_without_repeating(collected):
    before = {c: len(pd.read_csv(layout.kernel_csv(collected, c))) for c in sizes.CLASSES
              if layout.kernel_csv(collected, c).is_file()}
    assert main(["collect", "--device", "cpu", "--minutes", "0.15", "--out", str(collected),
                 "--parts", "fp32", "--json"]) == 0
    for cls, n in before.items():
        frame = pd.read_csv(layout.kernel_csv(collected, cls))
        dims = ["B", "M", "N", "K"] if cls in sizes.GEMM_CLASSES else ["B", "H"]
        assert len(frame) >= n and not frame.duplicated(["OPName", *dims]).any()
    rec = json.loads((collected / "provenance.json").read_text())
    assert len(rec["earlier_runs"]) == 2 and list(rec["parts"]) == ["fp32"]
    assert list(rec["earlier_runs"][0]["parts"]) == ["fp32", "tensor"]


def test_drops_into_a_copy_of_the_data(collected, data_dir, tmp_path, capsys, monkeypatch):
    """A copy whose test CSVs are real files (the rest linked): merged, the collected GPU is
    one more new GPU of the kernel check and its labels are read beside the others."""
    copy = tmp_path / "copy"
    src = data_dir
    dst = copy / layout.NEUSIGHT / "scripts" / "asplos"
    for part in ("data/device_configs", "data/dataset/train", "data/dataset/dims",
                 "data/DLmodel_configs", "label"):
        (dst / part).parent.mkdir(parents=True, exist_ok=True)
        (dst / part).symlink_to(src / part)
    shutil.copytree(src / "data" / "dataset" / "test", dst / "data" / "dataset" / "test")
    (dst / "label").unlink()
    shutil.copytree(src / "label", dst / "label", symlinks=True)
    (dst / "data" / "device_configs").unlink()
    shutil.copytree(src / "data" / "device_configs", dst / "data" / "device_configs")
    layout.merge_into(collected, copy)
    device = json.loads((collected / "provenance.json").read_text())["device"]
    splits = measured.gpu_splits(dst)
    assert device in splits["new_gpus"] and len(splits["train_gpus"]) >= 2
    elem = pd.read_csv(dst / "data" / "dataset" / "test" / "elem.csv")
    assert device in set(elem["Device"]) and elem["Device"].nunique() > 1
    assert "bert-inf-32-1" in set(labels.load_labels(dst)["tag"])
    # the commands a user runs next: the GPU is a new GPU of the kernel check, and its
    # labels are priced and scored beside the others
    monkeypatch.setenv("NSLIB_DATA", str(dst))
    capsys.readouterr()
    assert main(["eval-kernels", "--predictor", "roofline", "--json"]) == 0
    kern = json.loads(capsys.readouterr().out)
    assert kern["elementwise"]["new_gpus"] is not None
    assert main(["eval-models", "--predictor", "roofline", "--gpus", layout.stem(device),
                 "--json"]) == 0
    models = json.loads(capsys.readouterr().out)
    assert models["roofline"][device] > 0


def test_flows_through_the_measured_gpu_check(collected):
    from nslib.evaluation import measured_gpu as mg

    rep = mg.report(collected, fp32=("roofline",), tensor=("roofline",), steps=("roofline",))
    assert {"elementwise"} <= set(rep["fp32"]["errors"].index)
    assert (rep["fp32"]["errors"]["roofline"] >= 0).all()
    assert rep["steps"]["rows"]["pred_roofline"].gt(0).all()
    js = mg.report_json(rep)
    assert js["gpu"] == rep["gpu"] and "fp32" in js
    assert js["fp32"]["elementwise"]["median_ratio"]["roofline"] > 0


def test_harness_parts_against_hand_values():
    ev = [{"cat": "kernel", "name": "small", "ts": 1, "dur": 2, "args": {"grid": [4, 2, 1]}},
          {"cat": "kernel", "name": "big", "ts": 5, "dur": 9,
           "args": {"grid": [8, 1, 1], "block": [256, 1, 1], "warps per SM": 3.0}}]
    got = _parse_events(ev, cuda=True)
    assert [x.name for x in got] == ["small", "big"] and got[0].grid == (4, 2, 1)
    assert fastest_mean([5.0, 1.0, 3.0, 2.0], 2) == 1.5
    assert lanes_per_sm(9, 0) == 128 and lanes_per_sm(8, 0) == 64 and lanes_per_sm(8, 6) == 128
    assert parse_step("gpt2_large:train:1024:4").tag == "gpt2_large-train-1024-4"
    assert parse_step("llama3.1_8b:inf:2048:1:bf16").tag == "llama3.1_8b-inf-2048-1-bf16"
    with pytest.raises(ValueError, match="name:inf"):
        parse_step("gpt2_large:serve:1024")
    sheet, origin = datasheet("cpu", {"flops_per_s": 1e11, "bytes_per_s": 2e10,
                                      "bf16_flops_per_s": 3e11},
                              {"Device": "other", "Bf16FLOPs": 5.0})
    assert sheet["Device"].startswith("CPU") and sheet["Bf16FLOPs"] == 5.0
    assert origin["origin"]["Bf16FLOPs"] == "vendor datasheet" and sheet["Mem_Bw"] == 20.0


def test_a_folder_of_another_gpu_is_refused(collected, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(collected, other)
    rec = json.loads((other / "provenance.json").read_text())
    (other / "provenance.json").write_text(json.dumps({**rec, "device": "Some Other GPU"}))
    assert main(["collect", "--device", "cpu", "--minutes", "0.05", "--out", str(other),
                 "--parts", "fp32"]) == 2
    assert "holds measurements of 'Some Other GPU'" in capsys.readouterr().err


def test_a_collection_without_kernel_tables_says_so(collected, tmp_path):
    from nslib.evaluation.measured_gpu import fp32_kernels
    bare = tmp_path / "bare"
    shutil.copytree(collected, bare)
    for f in bare.rglob("*.csv"):
        if "test" in f.relative_to(bare).parts:
            f.unlink()
    with pytest.raises(FileNotFoundError, match="no FP32 kernel table of any class"):
        fp32_kernels(bare, predictors=["roofline"])


def test_cli_errors_are_clear(tmp_path, capsys):
    assert main(["collect", "--device", "cpu", "--out", str(tmp_path), "--parts", "x"]) == 2
    assert "unknown part" in capsys.readouterr().err
    assert main(["eval-measured", str(tmp_path)]) == 2
    assert "no `nslib collect` output" in capsys.readouterr().err


def test_a_step_that_would_outlast_the_budget_is_skipped_not_run(data_dir, tmp_path):
    # the first run says how long one takes: a step whose warm-up and two timed runs would end
    # past the part's deadline is skipped with the reason, after that one run
    import time

    from nslib.evaluation.collect.steps import measure_steps
    from nslib.evaluation.collect.timing import Clock
    step = parse_step("bert:train:32:1")
    t0 = time.monotonic()
    got = measure_steps([step], Clock(device="cpu", warmup=10**6), tmp_path, "cpu",
                        deadline=time.monotonic() + 5.0, progress=False)
    assert got["rows"] == 0 and "would outlast the time budget" in got["skipped"][step.tag]
    assert time.monotonic() - t0 < 60.0   # one run, not the million asked for
