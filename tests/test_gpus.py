import json

import pytest

from nslib.data.gpus import GPU, find_gpu, gpu_from_dict, load_gpu_file, load_gpus

GOOD = {"Device": "Tesla T4", "Dev_Mem": 15, "Mem_Bw": 320, "Num_Sm": 40, "Core_Per_SM": 64,
        "Freq": 1590, "SingleFLOPs": 8141, "L2Cache": 4}


def test_good_spec_round_trips():
    g = gpu_from_dict(GOOD)
    assert g == GPU("Tesla T4", 15, 320, 40, 64, 1590, 8141, 4, key="Tesla_T4")
    assert gpu_from_dict(g.to_json()) == g


@pytest.mark.parametrize("field", ["Dev_Mem", "Mem_Bw", "Num_Sm", "Core_Per_SM", "Freq",
                                   "SingleFLOPs", "L2Cache"])
@pytest.mark.parametrize("bad,words", [(None, "missing"), ("fast", "must be a number"),
                                       (0, "must be positive"), (-3, "must be positive"),
                                       (True, "must be a number")])
def test_each_bad_field_is_named(tmp_path, field, bad, words):
    raw = dict(GOOD)
    if bad is None:
        del raw[field]
    else:
        raw[field] = bad
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError) as e:
        load_gpu_file(path)
    assert field in str(e.value) and words in str(e.value) and "bad.json" in str(e.value)


def test_missing_device_and_malformed_json(tmp_path):
    with pytest.raises(ValueError, match="Device"):
        gpu_from_dict({k: v for k, v in GOOD.items() if k != "Device"})
    p = tmp_path / "broken.json"
    p.write_text("{not json")
    with pytest.raises(ValueError, match="broken.json.*not valid JSON"):
        load_gpu_file(p)
    with pytest.raises(ValueError, match="JSON object"):
        gpu_from_dict([1, 2])


def test_lookup_by_stem_device_and_alias(data_dir):
    gpus = load_gpus()
    assert find_gpu("Tesla_V100-PCIE-32GB", gpus).name == "Tesla V100-PCIE-32GB"
    assert find_gpu("Tesla V100-PCIE-32GB", gpus).key == "Tesla_V100-PCIE-32GB"
    assert find_gpu("V100", gpus).key == "Tesla_V100-PCIE-32GB"
    # the _TP variant shares the Device string; the canonical file wins
    assert find_gpu("H100", gpus).key == "NVIDIA_H100_80GB_HBM3"
    assert find_gpu("NVIDIA H100 80GB HBM3", gpus).peak_gflops == 66908
    assert find_gpu("a100 80gb", gpus).key == "NVIDIA_A100_80GB_PCIe"
    with pytest.raises(KeyError, match="ambiguous"):
        find_gpu("A100", gpus)
    with pytest.raises(KeyError, match="unknown GPU"):
        find_gpu("RTX 9090", gpus)
