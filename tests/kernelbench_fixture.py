"""A fake KernelBench folder for tests: one datasheet and one campaign folder."""
import json

SHEET = {"Device": "Fake GPU 9", "Dev_Mem": 16, "Mem_Bw": 1000, "Num_Sm": 10,
         "Core_Per_SM": 128, "Freq": 1500, "SingleFLOPs": 20000, "L2Cache": 8, "TDP": 150}


def fake_root(tmp_path):
    """(KernelBench root with the fake GPU's datasheet, its empty campaign folder)."""
    root = tmp_path / "kernelbench"
    (root / "device_configs").mkdir(parents=True)
    (root / "device_configs" / "Fake_GPU_9.json").write_text(json.dumps(SHEET))
    camp = root / "Fake_campaign"
    camp.mkdir()
    return root, camp
