"""Tests of ``nslib fetch --mixed`` (``nslib.data.fetch_mixed``) on fake mirrors and archives, and
on the shared copy of the data when there is one (no network)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from nslib import cli
from nslib.cli import commands
from nslib.data import fetch, fetch_mixed, mixed_data

ROOT = Path(__file__).resolve().parents[1]
GEMM = ("aic-core/src/aiconfigurator_core/systems/data/fake_gpu/gemm/vllm/1.0/"
        "gemm_perf.parquet")
SHEET = {"Device": "Fake GPU 7", "Dev_Mem": 16, "Mem_Bw": 1000, "Num_Sm": 10,
         "Core_Per_SM": 128, "Freq": 1500, "SingleFLOPs": 20000, "L2Cache": 8,
         "Bf16FLOPs": 160000}


def _gemm_bytes() -> bytes:
    frame = pd.DataFrame({"device": ["Fake GPU 7"] * 3, "gemm_dtype": ["bfloat16"] * 2 + ["fp8"],
                          "m": [1, 64, 64], "n": [128, 256, 256], "k": [512, 1024, 1024],
                          "latency": [0.002, 0.01, 0.006]})
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return buf.getvalue()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fake registry (two repositories), its datasheets and a mirror folder that matches."""
    trees = {"aiconfigurator": {"LICENSE": b"Apache-2.0\n", GEMM: _gemm_bytes()},
             "vidur": {"LICENSE": b"MIT\n", "data/x.csv": b"a,b\n1,2\n"}}
    reg = {name: {"repository": f"org/{name}", "commit": "abc123",
                  "url": f"https://example.org/{name}/abc123.tar.gz", "sha256": None,
                  "files": {rel: _sha(data) for rel, data in files.items()}}
           for name, files in trees.items()}
    sheets = {"Fake_GPU_7": {"source": "the fake datasheet", "datasheet": SHEET}}
    (tmp_path / "reg.json").write_text(json.dumps(reg))
    (tmp_path / "sheets.json").write_text(json.dumps(sheets))
    monkeypatch.setattr(fetch_mixed, "registry_path", lambda: tmp_path / "reg.json")
    monkeypatch.setattr(fetch_mixed, "datasheets_path", lambda: tmp_path / "sheets.json")
    monkeypatch.setenv("NSLIB_CACHE", str(tmp_path / "cache"))
    mirror = tmp_path / "mirror"
    for name, files in trees.items():
        for rel, data in files.items():
            (mirror / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (mirror / name / rel).write_bytes(data)
    (mirror / "aiconfigurator" / "unpinned.txt").write_text("not taken")
    (tmp_path / "out").mkdir()
    return {"trees": trees, "mirror": mirror, "dest": tmp_path / "out" / "mixed"}


def _only(dest: Path, *names: str) -> None:
    """``dest``'s folder holds exactly ``names``: no temp folder or half-written copy."""
    assert sorted(p.name for p in dest.parent.iterdir()) == sorted(names)


def _check_fake(dest: Path) -> None:
    table = mixed_data.gemm_table(dest)
    assert table["gpu"].tolist() == ["Fake GPU 7"] * 2  # the fp8 row is not BF16
    assert table["latency_ms"].tolist() == [0.002, 0.01]
    assert (table["bf16_gflops"] == 160000).all() and (table["mem_bw"] == 1000).all()
    assert json.loads((dest / "device_configs" / "Fake_GPU_7.json").read_text()) == SHEET
    assert not (dest / "aiconfigurator" / "unpinned.txt").exists()


def test_fetch_from_mirror_folder(fake):
    dest = fetch_mixed.fetch_mixed(fake["dest"], source=fake["mirror"], progress=False)
    assert dest == fake["dest"]
    _check_fake(dest)
    assert (dest / "vidur" / "data" / "x.csv").read_bytes() == b"a,b\n1,2\n"
    lock = fetch.read_lock(dest)
    assert lock["repositories"]["vidur"] == {
        "repository": "org/vidur", "commit": "abc123", "source": str(fake["mirror"] / "vidur"),
        "archive_sha256": None, "files": 2}
    assert lock["datasheets"]["files"] == 1
    _only(dest, "mixed", "mixed.lock.json")


def _tar(path: Path, files: dict[str, bytes], top: str) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for rel, data in files.items():
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _zip(path: Path, files: dict[str, bytes], top: str) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for rel, data in files.items():
            zf.writestr(f"{top}/{rel}", data)
    return path


def _archives(fake, folder: Path) -> dict[str, Path]:
    folder.mkdir(exist_ok=True)
    return {"aiconfigurator": _tar(folder / "aiconfigurator.tar.gz",
                                   fake["trees"]["aiconfigurator"], "aiconfigurator-abc123"),
            "vidur": _zip(folder / "vidur.zip", fake["trees"]["vidur"], "vidur-abc123")}


def test_fetch_from_archives_in_mirror(fake, tmp_path):
    archives = _archives(fake, tmp_path / "arch")
    dest = fetch_mixed.fetch_mixed(fake["dest"], source=tmp_path / "arch", progress=False)
    _check_fake(dest)
    lock = fetch.read_lock(dest)["repositories"]
    assert lock["aiconfigurator"]["archive_sha256"] == _sha(archives["aiconfigurator"].read_bytes())


def test_download_goes_through_pooch_cache(fake, tmp_path, monkeypatch):
    archives = {fetch_mixed.load_mixed_registry()[n]["url"]: p
                for n, p in _archives(fake, tmp_path / "arch").items()}
    calls = []

    def fake_retrieve(url, known_hash=None, path=None, progressbar=False, **kw):
        calls.append((url, Path(path)))
        return str(archives[url])

    monkeypatch.setattr(fetch.pooch, "retrieve", fake_retrieve)
    monkeypatch.setenv("NSLIB_MIXED", str(fake["dest"]))
    assert fetch_mixed.fetch_mixed(progress=False) == fake["dest"]  # NSLIB_MIXED is the target
    _check_fake(fake["dest"])
    assert calls == [(u, tmp_path / "cache" / "downloads") for u in archives]


def test_offline_is_a_clear_error(fake, monkeypatch):
    def offline(url, **kw):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(fetch.pooch, "retrieve", offline)
    with pytest.raises(ConnectionError, match="--source FOLDER"):
        fetch_mixed.fetch_mixed(fake["dest"], progress=False)
    _only(fake["dest"])


def test_corrupted_file_is_named_and_nothing_installed(fake):
    bad = fake["mirror"] / "vidur" / "data" / "x.csv"
    bad.write_bytes(b"a,b\n1,3\n")
    with pytest.raises(ValueError) as err:
        fetch_mixed.fetch_mixed(fake["dest"], source=fake["mirror"], progress=False)
    msg = str(err.value)
    assert "data/x.csv" in msg and "Nothing was installed" in msg
    assert _sha(b"a,b\n1,2\n") in msg and _sha(b"a,b\n1,3\n") in msg  # expected and got
    _only(fake["dest"])


def test_missing_file_and_lfs_pointer(fake):
    (fake["mirror"] / "vidur" / "LICENSE").unlink()
    (fake["mirror"] / "aiconfigurator" / GEMM).write_bytes(b"version https://git-lfs.github.com")
    with pytest.raises(ValueError) as err:
        fetch_mixed.fetch_mixed(fake["dest"], source=fake["mirror"], progress=False)
    assert "Git LFS pointer" in str(err.value) and GEMM in str(err.value)
    (fake["mirror"] / "aiconfigurator" / GEMM).write_bytes(_gemm_bytes())
    with pytest.raises(ValueError, match="LICENSE: missing"):
        fetch_mixed.fetch_mixed(fake["dest"], source=fake["mirror"], progress=False)
    _only(fake["dest"])


def test_existing_needs_force_and_failed_force_keeps_old(fake):
    fetch_mixed.fetch_mixed(fake["dest"], source=fake["mirror"], progress=False)
    with pytest.raises(FileExistsError, match="--force"):
        fetch_mixed.fetch_mixed(fake["dest"], source=fake["mirror"], progress=False)
    (fake["mirror"] / "vidur" / "LICENSE").write_text("changed")
    with pytest.raises(ValueError, match="LICENSE"):
        fetch_mixed.fetch_mixed(fake["dest"], source=fake["mirror"], force=True, progress=False)
    _check_fake(fake["dest"])
    assert (fake["dest"] / "vidur" / "LICENSE").read_text() == "MIT\n"
    _only(fake["dest"], "mixed", "mixed.lock.json")


def test_source_must_be_a_folder_with_each_repository(fake, tmp_path):
    with pytest.raises(FileNotFoundError, match="aiconfigurator/ and vidur/"):
        fetch_mixed.fetch_mixed(fake["dest"], source=tmp_path / "nope", progress=False)
    (tmp_path / "half" / "aiconfigurator").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no vidur/ folder nor vidur.tar.gz"):
        fetch_mixed.fetch_mixed(fake["dest"], source=tmp_path / "half", progress=False)
    _only(fake["dest"])


@pytest.mark.parametrize("rel,digest,what", [("../evil", "0" * 64, "unsafe path"),
                                             ("a//b", "0" * 64, "unsafe path"),
                                             ("ok", "xyz", "bad sha256")])
def test_bad_registry_refused(fake, tmp_path, rel, digest, what):
    reg = fetch_mixed.load_mixed_registry()
    reg["vidur"]["files"][rel] = digest
    (tmp_path / "reg.json").write_text(json.dumps(reg))
    with pytest.raises(ValueError, match=what):
        fetch_mixed.load_mixed_registry()


def test_datasheet_without_bf16_refused(fake, tmp_path):
    sheet = {k: v for k, v in SHEET.items() if k != "Bf16FLOPs"}
    (tmp_path / "sheets.json").write_text(json.dumps({"X": {"source": "s", "datasheet": sheet}}))
    with pytest.raises(ValueError, match="Bf16FLOPs"):
        fetch_mixed.load_datasheets()
    (tmp_path / "sheets.json").write_text(json.dumps({"X": {"datasheet": SHEET}}))
    with pytest.raises(ValueError, match="source"):
        fetch_mixed.load_datasheets()


def test_cli_mixed_option_sets_the_root(fake, monkeypatch):
    monkeypatch.setenv("NSLIB_MIXED", "unset-by-test")  # restored after the test
    src = str(fake["mirror"])
    assert cli.main(["--mixed", str(fake["dest"]), "fetch", "--mixed", "--source", src]) == 0
    assert os.environ["NSLIB_MIXED"] == str(fake["dest"])
    _check_fake(fake["dest"])
    other = fake["dest"].parent / "other"
    assert cli.main(["fetch", "--mixed", str(other), "--source", src]) == 0
    _check_fake(other)
    assert cli.main(["fetch", "--mixed", "--sha256", "0" * 64, "--source", src]) == 2
    args = commands.build_parser().parse_args(["predictors", "--mixed", "elsewhere"])
    assert args.mixed == "elsewhere"
    args = commands.build_parser().parse_args(["--mixed", "before", "predictors"])
    assert args.mixed == "before"


# --- the real registry, against the shared copy of the data when there is one ---

def _shared() -> Path:
    root = Path(os.environ.get("NSLIB_MIXED") or ROOT.parent / "shared" / "mixed")
    if not all((root / d).is_dir() for d in ("aiconfigurator", "vidur", "device_configs")):
        pytest.skip(f"nslib data not here: 16-bit (no shared copy at {root})")
    return root


def test_real_registry_is_well_formed():
    reg = fetch_mixed.load_mixed_registry()
    assert {e["repository"] for e in reg.values()} == {"ai-dynamo/aiconfigurator",
                                                       "microsoft/vidur"}
    for entry in reg.values():
        assert "LICENSE" in entry["files"] and entry["commit"] in entry["url"]
    assert len(fetch_mixed.load_datasheets()) == 8


def test_real_fetch_from_shared_copy(tmp_path, monkeypatch):
    shared = _shared()
    monkeypatch.setenv("NSLIB_CACHE", str(tmp_path / "cache"))
    dest = fetch_mixed.fetch_mixed(tmp_path / "mixed", source=shared, progress=False)
    for name, entry in fetch_mixed.load_mixed_registry().items():
        assert fetch_mixed.pin_files(dest / name) == entry["files"]
    written = {p.stem: json.loads(p.read_text()) for p in (dest / "device_configs").glob("*")}
    theirs = {p.stem: json.loads(p.read_text())
              for p in (shared / "device_configs").glob("*.json")}
    assert written == theirs
    ours = set(mixed_data.gemm_table(dest)["gpu"])
    pinned = {rel.split("/")[5] for rel in fetch_mixed.load_mixed_registry()["aiconfigurator"]["files"]
              if rel.endswith("gemm_perf.parquet")}  # .../systems/data/<gpu>/gemm/...
    assert len(ours) == len(pinned) >= 1
    assert ours <= set(mixed_data.gemm_table(shared)["gpu"])
