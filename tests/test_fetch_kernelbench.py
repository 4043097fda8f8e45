"""Tests of ``nslib fetch --kernelbench`` (``nslib.data.fetch_kernelbench``) on a fake registry and
mirrors, and on the shared copy of the data when there is one (no network)."""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from nslib import cli
from nslib.data import fetch, fetch_kernelbench as fk, kernelbench
from nslib.data.paths import DataNotFoundError

SHEET = {"Device": "Fake GPU 9", "Dev_Mem": 16, "Mem_Bw": 1000, "Num_Sm": 10,
         "Core_Per_SM": 128, "Freq": 1500, "SingleFLOPs": 20000, "L2Cache": 8}
TIMING_COMMIT, PROBLEMS_COMMIT = "aaaaaaa", "bbbbbbb"
TIMINGS = {"level1": {"1_Square_matmul.py": {"mean": 1.5, "std": 0.1, "min": 1.4,
                                             "hardware": "Fake GPU 9"},
                      "2_ReLU.py": {"mean": 0.02, "std": 0.0, "min": 0.02,
                                    "hardware": "Fake GPU 9"}},
           "level2": {"1_Conv_ReLU.py": {"mean": 3.0, "hardware": "Fake GPU 9"}}}
PROBLEMS = {"level1/1_Square_matmul.py": b"N = 64\n", "level1/2_ReLU.py": b"relu\n",
            "level2/1_Conv_ReLU.py": b"conv\n"}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _timing_bytes() -> bytes:
    return json.dumps(TIMINGS, indent=4).encode()


def _source_meta() -> dict:
    return {"repository": fk.REPOSITORY,
            "timing_file": "results/timing/FAKE/baseline_time_torch.json",
            "timing_commit": TIMING_COMMIT, "problems_commit": PROBLEMS_COMMIT,
            "timing": "fake"}


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fake checked copy (one campaign), its registry (from :func:`pin_kernelbench`), its
    datasheets, and mirrors: the copy itself and per-commit archive/folder."""
    copy = tmp_path / "copy"
    camp = copy / "FAKE"
    for rel, data in PROBLEMS.items():
        (camp / rel).parent.mkdir(parents=True, exist_ok=True)
        (camp / rel).write_bytes(data)
    (camp / "baseline_time_torch.json").write_bytes(_timing_bytes())
    (camp / "source.json").write_text(json.dumps(_source_meta(), indent=2) + "\n")
    (copy / "LICENSE").write_text("MIT License\n")
    (copy / "device_configs").mkdir()
    (copy / "device_configs" / "Fake_GPU_9.json").write_text(json.dumps(SHEET, indent=4) + "\n")
    reg = fk.pin_kernelbench(copy)
    (tmp_path / "reg.json").write_text(json.dumps(reg))
    (tmp_path / "sheets.json").write_text(json.dumps(
        {"Fake_GPU_9": {"source": "the fake datasheet", "datasheet": SHEET}}))
    monkeypatch.setattr(fk, "registry_path", lambda: tmp_path / "reg.json")
    monkeypatch.setattr(fk, "datasheets_path", lambda: tmp_path / "sheets.json")
    monkeypatch.setenv("NSLIB_CACHE", str(tmp_path / "cache"))
    # per-commit mirror: the timing commit as a GitHub-style tarball, the problems as a clone
    commits = tmp_path / "commits"
    commits.mkdir()
    with tarfile.open(commits / f"{TIMING_COMMIT}.tar.gz", "w:gz") as tf:
        for rel, data in {"LICENSE": b"MIT License\n",
                          "results/timing/FAKE/baseline_time_torch.json": _timing_bytes()}.items():
            info = tarfile.TarInfo(f"KernelBench-{TIMING_COMMIT}/{rel}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    for rel, data in PROBLEMS.items():
        (commits / PROBLEMS_COMMIT / "KernelBench" / rel).parent.mkdir(parents=True,
                                                                       exist_ok=True)
        (commits / PROBLEMS_COMMIT / "KernelBench" / rel).write_bytes(data)
    (tmp_path / "out").mkdir()
    return {"copy": copy, "commits": commits, "dest": tmp_path / "out" / "kb", "reg": reg}


def _only(dest: Path, *names: str) -> None:
    """``dest``'s folder holds exactly ``names``: no temp folder or half-written copy."""
    assert sorted(p.name for p in dest.parent.iterdir()) == sorted(names)


def _same_tree(a: Path, b: Path, skip=("README.md",)) -> None:
    files = {p.relative_to(a).as_posix(): p.read_bytes() for p in a.rglob("*")
             if p.is_file() and p.name not in skip}
    theirs = {p.relative_to(b).as_posix(): p.read_bytes() for p in b.rglob("*")
              if p.is_file() and p.name not in skip}
    assert sorted(files) == sorted(theirs)
    for rel in files:
        if rel.startswith("device_configs/"):
            assert json.loads(files[rel]) == json.loads(theirs[rel]), rel
        else:
            assert files[rel] == theirs[rel], rel


def test_registry_from_pin(fake):
    reg = fk.load_kernelbench_registry()
    entry = reg["campaigns"]["FAKE"]
    assert entry["timing_commit"] == TIMING_COMMIT and entry["problems_prefix"] == "KernelBench/"
    assert entry["archives"][PROBLEMS_COMMIT] == (
        f"https://github.com/ScalingIntelligence/KernelBench/archive/{PROBLEMS_COMMIT}.tar.gz")
    assert entry["files"]["FAKE/level1/2_ReLU.py"] == _sha(b"relu\n")
    assert set(entry["files"]) == {"FAKE/" + r for r in
                                   (*PROBLEMS, "baseline_time_torch.json", "source.json")}
    assert reg["license"]["sha256"] == _sha(b"MIT License\n")


@pytest.mark.parametrize("mirror", ["copy", "commits"])
def test_fetch_matches(fake, mirror):
    dest = fk.fetch_kernelbench(fake["dest"], source=fake[mirror], progress=False)
    assert dest == fake["dest"]
    _same_tree(dest, fake["copy"])
    got = kernelbench.timings(dest, level=1)
    assert got["latency_ms"].tolist() == [1.5, 0.02]
    assert got["path"].notna().all() and set(got["hardware"]) == {"Fake GPU 9"}
    assert list(kernelbench.datasheets(dest)) == ["Fake GPU 9"]
    lock = fetch.read_lock(dest)
    assert lock["campaigns"]["FAKE"]["files"] == 5 and lock["datasheets"]["files"] == 1
    _only(dest, "kb", "kb.lock.json")


def test_download_goes_through_pooch(fake, monkeypatch, tmp_path):
    # the clone of the problems' commit, packed as the archive a download would give
    arch = tmp_path / f"{PROBLEMS_COMMIT}.tar.gz"
    with tarfile.open(arch, "w:gz") as tf:
        tf.add(fake["commits"] / PROBLEMS_COMMIT, arcname=f"KernelBench-{PROBLEMS_COMMIT}")
    files = {fake["reg"]["campaigns"]["FAKE"]["archives"][TIMING_COMMIT]:
             fake["commits"] / f"{TIMING_COMMIT}.tar.gz",
             fake["reg"]["campaigns"]["FAKE"]["archives"][PROBLEMS_COMMIT]: arch}
    calls = []

    def fake_retrieve(url, known_hash=None, path=None, progressbar=False, **kw):
        calls.append(url)
        return str(files[url])

    monkeypatch.setattr(fetch.pooch, "retrieve", fake_retrieve)
    monkeypatch.setenv("NSLIB_KERNELBENCH", str(fake["dest"]))
    assert fk.fetch_kernelbench(progress=False) == fake["dest"]
    _same_tree(fake["dest"], fake["copy"])
    assert sorted(calls) == sorted(files)


def test_corrupted_file_is_named_and_nothing_installed(fake):
    bad = fake["copy"] / "FAKE" / "level1" / "2_ReLU.py"
    bad.write_bytes(b"RELU\n")
    with pytest.raises(ValueError) as err:
        fk.fetch_kernelbench(fake["dest"], source=fake["copy"], progress=False)
    msg = str(err.value)
    assert "FAKE/level1/2_ReLU.py" in msg and "Nothing was installed" in msg
    assert _sha(b"relu\n") in msg and _sha(b"RELU\n") in msg  # expected and got
    _only(fake["dest"])


def test_missing_file_in_archive_is_named(fake):
    (fake["commits"] / PROBLEMS_COMMIT / "KernelBench" / "level2" / "1_Conv_ReLU.py").unlink()
    with pytest.raises(ValueError, match="FAKE/level2/1_Conv_ReLU.py: missing"):
        fk.fetch_kernelbench(fake["dest"], source=fake["commits"], progress=False)
    _only(fake["dest"])


def test_existing_needs_force_and_force_replaces(fake):
    fk.fetch_kernelbench(fake["dest"], source=fake["copy"], progress=False)
    with pytest.raises(FileExistsError, match="--force"):
        fk.fetch_kernelbench(fake["dest"], source=fake["copy"], progress=False)
    (fake["dest"] / "stale.txt").write_text("old")
    (fake["copy"] / "LICENSE").write_text("changed")  # a failed --force keeps the old copy
    with pytest.raises(ValueError, match="LICENSE"):
        fk.fetch_kernelbench(fake["dest"], source=fake["copy"], force=True, progress=False)
    assert (fake["dest"] / "stale.txt").exists()
    (fake["copy"] / "LICENSE").write_text("MIT License\n")
    fk.fetch_kernelbench(fake["dest"], source=fake["copy"], force=True, progress=False)
    assert not (fake["dest"] / "stale.txt").exists()
    _same_tree(fake["dest"], fake["copy"])
    _only(fake["dest"], "kb", "kb.lock.json")


def test_source_must_hold_each_commit(fake, tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        fk.fetch_kernelbench(fake["dest"], source=tmp_path / "nope", progress=False)
    (fake["commits"] / f"{TIMING_COMMIT}.tar.gz").unlink()
    with pytest.raises(FileNotFoundError, match=f"{TIMING_COMMIT}.tar.gz"):
        fk.fetch_kernelbench(fake["dest"], source=fake["commits"], progress=False)
    _only(fake["dest"])


def test_bad_registry_refused(fake, tmp_path):
    reg = json.loads((tmp_path / "reg.json").read_text())
    reg["campaigns"]["FAKE"]["files"]["FAKE/notes.txt"] = "0" * 64
    (tmp_path / "reg.json").write_text(json.dumps(reg))
    with pytest.raises(ValueError, match="not one of the campaign's files"):
        fk.load_kernelbench_registry()
    del reg["campaigns"]["FAKE"]["files"]["FAKE/notes.txt"]
    reg["campaigns"]["FAKE"]["files"]["FAKE/../x/level1/a.py"] = "0" * 64
    (tmp_path / "reg.json").write_text(json.dumps(reg))
    with pytest.raises(ValueError, match="unsafe path"):
        fk.load_kernelbench_registry()


def test_cli(fake, tmp_path):
    src = str(fake["copy"])
    assert cli.main(["fetch", "--kernelbench", str(fake["dest"]), "--source", src]) == 0
    _same_tree(fake["dest"], fake["copy"])
    assert cli.main(["fetch", "--kernelbench", str(fake["dest"]), "--source", src]) == 2
    other = str(tmp_path / "out" / "other")
    assert cli.main(["fetch", "--kernelbench", other, "--mixed", "--source", src]) == 2
    assert cli.main(["fetch", "--kernelbench", other, "--sha256", "0" * 64,
                     "--source", src]) == 2
    assert not Path(other).exists()


# --- the real registry, against the shared copy of the data when there is one ---

def _shared() -> Path:
    try:
        return kernelbench.kernelbench_root()
    except DataNotFoundError as e:
        pytest.skip(f"nslib data not here: KernelBench ({e})")


def test_real_registry_is_well_formed():
    reg = fk.load_kernelbench_registry()
    assert {e["repository"] for e in reg["campaigns"].values()} == {fk.REPOSITORY}
    for entry in reg["campaigns"].values():
        for commit, url in entry["archives"].items():
            assert url == f"https://github.com/{fk.REPOSITORY}/archive/{commit}.tar.gz"
    sheets = fk.load_datasheets(fk.datasheets_path(), need_bf16=False)
    assert all(s["Device"] for s in sheets.values())


def test_real_fetch_from_shared_copy(tmp_path, monkeypatch):
    shared = _shared()
    monkeypatch.setenv("NSLIB_CACHE", str(tmp_path / "cache"))
    dest = fk.fetch_kernelbench(tmp_path / "kb", source=shared, progress=False)
    _same_tree(dest, shared)
    assert fk.pin_kernelbench(dest) == fk.load_kernelbench_registry()
    for level in kernelbench.LEVELS:
        theirs = kernelbench.timings(shared, level)
        ours = kernelbench.timings(dest, level)
        theirs["path"] = theirs["path"].str.replace(str(shared), str(dest), regex=False)
        assert len(ours) > 0
        pd.testing.assert_frame_equal(ours, theirs)
    assert kernelbench.datasheets(dest) == kernelbench.datasheets(shared)
