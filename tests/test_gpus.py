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


# --- the optional vendor figures TDP (W) and Link_Bw (GB/s, both directions) ---

OPTIONAL = [("TDP", "tdp_w"), ("Link_Bw", "link_gbps")]


@pytest.mark.parametrize("key,field", OPTIONAL)
def test_optional_power_and_link_round_trip(key, field):
    g = gpu_from_dict({**GOOD, key: 70})
    assert getattr(g, field) == 70.0
    assert g.to_json()[key] == 70.0
    assert gpu_from_dict(g.to_json()) == g
    bare = gpu_from_dict(GOOD)  # a datasheet without it still loads
    assert getattr(bare, field) is None and key not in bare.to_json()
    assert gpu_from_dict({**GOOD, key: None}) == bare


@pytest.mark.parametrize("key,field", OPTIONAL)
@pytest.mark.parametrize("bad,words", [(-70, "must be positive"), (0, "must be positive"),
                                       (float("nan"), "finite"), (float("inf"), "finite"),
                                       ("70", "must be a number"), (True, "must be a number")])
def test_bad_power_or_link_refused_naming_the_field(key, field, bad, words):
    with pytest.raises(ValueError) as e:
        gpu_from_dict({**GOOD, key: bad}, source="spec.json")
    msg = str(e.value)
    assert f"'{key}'" in msg and words in msg and "spec.json" in msg and "drop the key" in msg


def test_nan_tdp_in_a_json_file_refused(tmp_path):
    path = tmp_path / "T4.json"
    path.write_text(json.dumps(GOOD)[:-1] + ', "TDP": NaN}')
    with pytest.raises(ValueError, match=r"T4\.json.*'TDP' \(maximum board power, W\).*finite"):
        load_gpu_file(path)


def test_gpus_listing_shows_tdp_dash_when_absent(tmp_path, monkeypatch, capsys):
    from nslib.cli.commands import main
    from nslib.data.gpus import listing_table
    folder = tmp_path / "data" / "device_configs"
    folder.mkdir(parents=True)
    (folder / "Tesla_T4.json").write_text(json.dumps({**GOOD, "TDP": 70, "Link_Bw": 32}))
    (folder / "Other.json").write_text(json.dumps({**GOOD, "Device": "Other GPU"}))
    monkeypatch.setenv("NSLIB_DATA", str(tmp_path))  # restored after: main() sets it globally
    monkeypatch.setenv("NSLIB_MIXED", str(tmp_path / "no-mixed"))
    monkeypatch.setenv("NSLIB_KERNELBENCH", str(tmp_path / "no-kernelbench"))
    assert main(["gpus"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = lines[0].split()
    assert head[-3:] == ["Bf16FLOPs", "TDP", "Link_Bw"]
    other, t4 = (dict(zip(head[-3:], line.split()[-3:])) for line in lines[2:])
    assert other == {"Bf16FLOPs": "-", "TDP": "-", "Link_Bw": "-"}
    assert float(t4["TDP"]) == 70 and float(t4["Link_Bw"]) == 32
    assert main(["gpus", "--json"]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)}
    assert (rows["Tesla_T4"]["TDP"], rows["Tesla_T4"]["Link_Bw"]) == (70, 32)
    assert "TDP" not in rows["Other"]
    # the optional columns are there even when no datasheet gives them
    bare = listing_table([{"key": "Other", "data": "neusight", **gpu_from_dict(GOOD).to_json()}])
    assert bare.splitlines()[0].split()[-3:] == ["Bf16FLOPs", "TDP", "Link_Bw"]


def test_explorer_summary_shows_tdp_when_given():
    from nslib.explore.gpus import datasheet_summary
    assert datasheet_summary(gpu_from_dict({**GOOD, "TDP": 70})).endswith(", TDP 70 W")
    assert "TDP" not in datasheet_summary(gpu_from_dict(GOOD))


def test_a_variant_datasheet_is_listed_as_one(tmp_path, monkeypatch, capsys):
    from nslib.cli.commands import main
    from nslib.data.registry import variant_of
    folder = tmp_path / "data" / "device_configs"
    folder.mkdir(parents=True)
    (folder / "Tesla_T4.json").write_text(json.dumps(GOOD))
    (folder / "Tesla_T4_TP.json").write_text(json.dumps({**GOOD, "Dev_Mem": 30}))  # same Device
    (folder / "Other.json").write_text(json.dumps({**GOOD, "Device": "Other GPU"}))
    monkeypatch.setenv("NSLIB_DATA", str(tmp_path))
    monkeypatch.setenv("NSLIB_MIXED", str(tmp_path / "no-mixed"))
    monkeypatch.setenv("NSLIB_KERNELBENCH", str(tmp_path / "no-kernelbench"))
    sheets = {p.stem: load_gpu_file(p) for p in sorted(folder.glob("*.json"))}
    assert variant_of(sheets) == {"Tesla_T4_TP": "Tesla_T4"}
    assert main(["gpus", "--json"]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["Tesla_T4_TP"]["variant_of"] == "Tesla_T4"
    assert rows["Tesla_T4"]["variant_of"] is None and rows["Other"]["variant_of"] is None
    assert main(["gpus"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "variant_of"
    assert {ln.split()[0]: ln.split()[-1] for ln in lines[2:]} == {
        "Other": "-", "Tesla_T4": "-", "Tesla_T4_TP": "Tesla_T4"}
