"""The datasheet's SM count checked against the profiler's (nslib.kernels.profiled)."""
import json

from nslib.kernels.profiled import kernel_files, profiled_sms, sm_mismatches

HEADER = "OPName,Latency,Device,Blocks per SM,Grid x,Grid y,Grid z,B,H\n"


def _sheet(name, sms):
    return {"Device": name, "Dev_Mem": 8, "Mem_Bw": 200, "Num_Sm": sms, "Core_Per_SM": 64,
            "Freq": 1100, "SingleFLOPs": 5600, "L2Cache": 2}


def _data(tmp_path):
    root = tmp_path / "data"
    (root / "device_configs").mkdir(parents=True)
    # the datasheet counts 40 SMs; the profiler saw 30 blocks land 1.5 per SM: 20 SMs
    (root / "device_configs" / "Odd.json").write_text(json.dumps(_sheet("Odd GPU", 40)))
    (root / "device_configs" / "Fine.json").write_text(json.dumps(_sheet("Fine GPU", 16)))
    collect = root / "dataset" / "train" / "collect" / "add" / "v1"
    collect.mkdir(parents=True)
    (collect / "Odd GPU.csv").write_text(HEADER + "add,0.1,Odd GPU,1.5,30,1,1,1,64\n"
                                         "add,0.2,Odd GPU,0.5,5,2,1,1,64\n")
    (collect / "Fine GPU.csv").write_text(HEADER + "add,0.1,Fine GPU,2.0,32,1,1,1,64\n"
                                          "add,0.1,Fine GPU,0,0,1,1,1,64\n")   # no record
    (root / "dataset" / "test").mkdir()
    (root / "dataset" / "test" / "elem.csv").write_text("OPName,Latency,Device\nadd,1,Odd GPU\n")
    return tmp_path


def test_the_profiler_counts_the_sms_a_gpu_ran_on(tmp_path):
    data = _data(tmp_path)
    files = kernel_files(data)
    assert len(files) == 3
    # a test table without the profiler's columns adds nothing
    assert profiled_sms(files) == {"Odd GPU": 20.0, "Fine GPU": 16.0}


def test_a_datasheet_that_disagrees_is_named(tmp_path):
    lines = sm_mismatches(_data(tmp_path))
    assert len(lines) == 1
    assert lines[0].startswith("Odd GPU: its measured kernels ran on 20 SMs")
    assert "Num_Sm 40 (Odd.json)" in lines[0]
