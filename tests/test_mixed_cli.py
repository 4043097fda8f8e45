"""`nslib eval-kernels --dtype bf16` on a fake 16-bit data folder: the protocols, the JSON
shape, a GPU dropped into the folder, and clear errors."""
from __future__ import annotations

import json

import pytest
from mixed_fixture import SHEETS, write_gpu, write_mixed

from nslib.cli.commands import main
from nslib.data import mixed_data


@pytest.fixture
def fake(tmp_path, monkeypatch):
    root = write_mixed(tmp_path / "mixed", gpus=("gpu_a", "gpu_b"))
    monkeypatch.setenv("NSLIB_MIXED", str(root))
    monkeypatch.setenv("NSLIB_CACHE", str(tmp_path / "cache"))
    for f in (mixed_data._gemm, mixed_data._attention):
        f.cache_clear()
    yield root
    for f in (mixed_data._gemm, mixed_data._attention):
        f.cache_clear()


def _json(capsys, *argv) -> dict:
    assert main(["eval-kernels", "--dtype", "bf16", "--quick", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_logo_reports_every_measured_gpu_per_kind(fake, capsys):
    res = _json(capsys, "--logo", "--predictor", "roofline_eff")
    assert set(res) == {"gemm", "attention"}
    assert set(res["gemm"]) == {"Fake GPU A", "Fake GPU B"}
    # the fake GEMMs follow roof / 0.7 + 5 us on both GPUs: a fitted efficiency beats none
    plain = _json(capsys, "--logo", "--predictor", "roofline")
    assert all(res["gemm"][g] < plain["gemm"][g] for g in res["gemm"])


def test_dropped_in_gpu_is_scored_with_no_code_change(fake, capsys):
    write_gpu(fake, "gpu_c", SHEETS["gpu_c"])
    for f in (mixed_data._gemm, mixed_data._attention):
        f.cache_clear()
    res = _json(capsys, "--test-gpus", "Fake_GPU_C", "--predictor", "roofline")
    assert res["gemm"].keys() == {"Fake GPU C"} == res["attention"].keys()
    logo = _json(capsys, "--predictor", "roofline")  # the default 16-bit protocol: LOGO
    assert set(logo["gemm"]) == {"Fake GPU A", "Fake GPU B", "Fake GPU C"}


@pytest.mark.parametrize("argv, match", [
    (["--dtype", "bf16", "--test-gpus", "Fake GPU Z"], "not measured"),
    (["--dtype", "bf16", "--logo", "--test-gpus", "Fake GPU A"], "two protocols"),
    (["--dtype", "bf16", "--lookup"], "FP32 kernels only"),
    (["--dtype", "int4"], "unknown dtype"),
    (["--test-gpus", "Fake GPU A"], "16-bit kernels"),
    (["--dtype", "bf16", "--predictor", "habitat"], "unknown predictor 'habitat' of kind gemm"),
])
def test_bad_requests_are_clear_errors(fake, capsys, argv, match):
    assert main(["eval-kernels", "--quick", *argv]) == 2
    assert match in capsys.readouterr().err
