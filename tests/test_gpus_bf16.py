"""GPU datasheets with the optional ``Bf16FLOPs`` field: missing loads, bad values are refused."""
from __future__ import annotations

import json
import math

import pytest

from nslib.data.gpus import gpu_from_dict, load_gpu_file, load_mixed_gpus

BASE = {"Device": "Fake GPU 7", "Dev_Mem": 16, "Mem_Bw": 1000, "Num_Sm": 10,
        "Core_Per_SM": 128, "Freq": 1500, "SingleFLOPs": 20000, "L2Cache": 8}


def test_missing_bf16_loads_and_asks_for_it_by_name():
    gpu = gpu_from_dict(BASE)
    assert gpu.bf16_gflops is None and gpu.peak_gflops == 20000
    assert "Bf16FLOPs" not in gpu.to_json()
    with pytest.raises(ValueError, match="'Fake GPU 7' has no 'Bf16FLOPs'"):
        gpu.bf16_peak()


def test_bf16_given_round_trips():
    gpu = gpu_from_dict({**BASE, "Bf16FLOPs": 160000})
    assert gpu.bf16_peak() == 160000.0
    assert gpu_from_dict(gpu.to_json()) == gpu


@pytest.mark.parametrize("bad,why", [("160000", "must be a number"), (-5, "positive"),
                                     (0, "positive"), (math.nan, "finite"),
                                     (math.inf, "finite"), (True, "must be a number")])
def test_bad_bf16_refused_naming_the_field(bad, why):
    with pytest.raises(ValueError) as err:
        gpu_from_dict({**BASE, "Bf16FLOPs": bad}, source="spec.json")
    assert "spec.json" in str(err.value) and "'Bf16FLOPs'" in str(err.value)
    assert why in str(err.value)


def test_nan_in_a_json_file_refused(tmp_path):
    path = tmp_path / "Fake.json"
    path.write_text(json.dumps(BASE)[:-1] + ', "Bf16FLOPs": NaN}')
    with pytest.raises(ValueError, match=r"Fake\.json.*'Bf16FLOPs'.*finite"):
        load_gpu_file(path)


def test_mixed_folder_with_a_datasheet_lacking_bf16(tmp_path):
    (tmp_path / "device_configs").mkdir()
    (tmp_path / "device_configs" / "A.json").write_text(json.dumps(BASE))
    (tmp_path / "device_configs" / "B.json").write_text(
        json.dumps({**BASE, "Device": "Fake GPU 8", "Bf16FLOPs": 1e5}))
    gpus = load_mixed_gpus(tmp_path)
    assert [g.bf16_gflops for g in gpus.values()] == [None, 1e5]
