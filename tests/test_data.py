import json
import os
from pathlib import Path

import pandas as pd
import pytest

from nslib.data.paths import DataNotFoundError
from nslib.kernels import measured, sizes


def test_tables_have_the_tidy_columns(data_dir):
    for cls in sizes.CLASSES:
        for split in measured.SPLITS:
            df = measured.kernel_table(cls, split)
            assert len(df) > 100
            for col in ("op", "gpu", "latency_ms", "kernel_name", "grid_x", "num_sm",
                        "peak_gflops", "mem_bw", "flops", "bytes", "blocks", "waves"):
                assert col in df, (cls, split, col)
            assert (df["latency_ms"] > 0).all() and (df["waves"] >= 1).all()
            assert set(df["cls"]) == {cls}


def test_gemm_tiles_agree_with_the_launch_grid(data_dir):
    # the output tiles (blocks over the law's split-K slices) must equal the launch grid
    df = measured.kernel_table("bmm", "train")
    grid = df["grid_x"] * df["grid_y"] * df["grid_z"]
    assert (df["blocks"] / df["split"] == grid).mean() > 0.95


def test_splits_come_from_the_data(data_dir):
    s = measured.gpu_splits()
    assert len(s["train_gpus"]) == 5
    assert set(s["new_gpus"]) == set(s["test_gpus"]) - set(s["train_gpus"])
    assert s["new_gpus"]  # the test split has GPUs never trained on


def test_cache_is_keyed_by_content(data_dir):
    a = measured.table_key("softmax", "test")
    assert a == measured.table_key("softmax", "test")
    assert a != measured.table_key("layernorm", "test")
    measured._cached_table.cache_clear()  # other tests may have filled the in-memory layer
    measured.kernel_table("softmax", "test")
    assert (Path(os.environ["NSLIB_CACHE"]) / "tables" / f"softmax-test-{a}.parquet").is_file()


def test_missing_data_folder_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("NSLIB_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(DataNotFoundError, match="nslib fetch.*NSLIB_DATA"):
        measured.kernel_table("bmm", "test")


def _mirror(src: Path, dst: Path) -> Path:
    """A writable copy of the data made of symlinks (the real data is read-only)."""
    for p in src.rglob("*"):
        q = dst / p.relative_to(src)
        if p.is_dir():
            q.mkdir(parents=True, exist_ok=True)
        else:
            q.parent.mkdir(parents=True, exist_ok=True)
            q.symlink_to(p)
    return dst


@pytest.fixture
def mirror(data_dir, tmp_path, monkeypatch):
    root = _mirror(data_dir / "data", tmp_path / "scripts" / "asplos" / "data")
    monkeypatch.setenv("NSLIB_DATA", str(tmp_path))
    return root


def test_missing_file_and_unexpected_columns(mirror):
    (mirror / "dataset" / "test" / "softmax.csv").unlink()
    with pytest.raises(DataNotFoundError, match="softmax test kernels.*nslib fetch"):
        measured.kernel_table("softmax", "test")
    ln = mirror / "dataset" / "test" / "ln.csv"
    df = pd.read_csv(ln.resolve()).drop(columns=["Latency"])
    ln.unlink()
    df.to_csv(ln, index=False)
    with pytest.raises(ValueError, match="Latency.*missing"):
        measured.kernel_table("layernorm", "test")


def test_a_new_gpu_flows_through_without_code_changes(mirror):
    """Drop a new GPU's config and test kernels into the data: it becomes a new GPU."""
    spec = {"Device": "NVIDIA L4", "Dev_Mem": 24, "Mem_Bw": 300, "Num_Sm": 58,
            "Core_Per_SM": 128, "Freq": 2040, "SingleFLOPs": 30300, "L2Cache": 48}
    (mirror / "device_configs" / "NVIDIA_L4.json").write_text(json.dumps(spec))
    path = mirror / "dataset" / "test" / "bmm.csv"
    df = pd.read_csv(path.resolve())
    extra = df[df["Device"] == "Tesla T4"].head(50).assign(Device="NVIDIA L4")
    path.unlink()
    pd.concat([df, extra]).to_csv(path, index=False)
    s = measured.gpu_splits()
    assert "NVIDIA L4" in s["new_gpus"]
    t = measured.kernel_table("bmm", "test")
    assert (t[t["gpu"] == "NVIDIA L4"]["num_sm"] == 58).all()


def test_kernels_of_a_gpu_without_config_are_a_clear_error(mirror):
    path = mirror / "dataset" / "test" / "ln.csv"
    df = pd.read_csv(path.resolve())
    path.unlink()
    df.assign(Device="Mystery GPU").to_csv(path, index=False)
    with pytest.raises(ValueError, match="Mystery GPU.*device_configs"):
        measured.kernel_table("layernorm", "test")
