"""Tests of ``nslib.data.fetch`` on small fake NeuSight archives (no network)."""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from nslib.data import fetch, paths
from nslib.data.gpus import load_gpus

T4 = {"Device": "Tesla T4", "Dev_Mem": 15, "Mem_Bw": 320, "Num_Sm": 40, "Core_Per_SM": 64,
      "Freq": 1590, "SingleFLOPs": 8141, "L2Cache": 4}
# what the fetch adds to upstream's T4 file (datasets/neusight_extras.json)
T4_FETCHED = {**T4, "TDP": 70, "Link_Bw": 32}
CONFIG = "scripts/asplos/data/device_configs/Tesla_T4.json"
SHARED_DEVICES = Path(__file__).resolve().parents[2] / "shared" / "neusight" / "scripts" / \
    "asplos" / "data" / "device_configs"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NSLIB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("NSLIB_DATA", raising=False)


def _files(prefix: str = "NeuSight-abc/", config: str = CONFIG) -> dict[str, bytes]:
    return {prefix + config: json.dumps(T4).encode(), prefix + "README.md": b"fake NeuSight\n"}


def _tar(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _zip(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def dest(tmp_path) -> Path:
    (tmp_path / "out").mkdir()
    return tmp_path / "out" / "neusight"


def _clean(dest: Path) -> None:
    """Nothing but what was there before: no dest, no temp folders, no lock beside it."""
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_fetch_local_archive(tmp_path, dest, kind):
    archive = (_tar(tmp_path / "a.tar.gz", _files()) if kind == "tar"
               else _zip(tmp_path / "a.zip", _files()))
    assert fetch.fetch(dest, source=archive, progress=False) == dest
    assert json.loads((dest / CONFIG).read_text()) == T4_FETCHED  # prefix NeuSight-abc/ stripped
    assert paths.data_root(dest) == (dest / "scripts" / "asplos").resolve()
    lock = json.loads((dest.parent / "neusight.lock.json").read_text())
    assert lock["sha256"] == _sha(archive)
    assert lock["source"] == str(archive)
    assert lock["commit"] == fetch.load_registry()["commit"]
    assert lock["fetched_at"]
    assert fetch.read_lock(dest) == lock
    assert sorted(p.name for p in dest.parent.iterdir()) == ["neusight", "neusight.lock.json"]


def test_fetch_right_sha256_accepted(tmp_path, dest):
    archive = _tar(tmp_path / "a.tgz", _files())
    fetch.fetch(dest, source=archive, sha256=_sha(archive), progress=False)
    assert (dest / CONFIG).is_file()


def test_wrong_sha256_refused(tmp_path, dest):
    archive = _tar(tmp_path / "a.tar.gz", _files())
    with pytest.raises(ValueError) as err:
        fetch.fetch(dest, source=archive, sha256="0" * 64, progress=False)
    assert "0" * 64 in str(err.value) and _sha(archive) in str(err.value)
    _clean(dest)


def test_not_a_neusight_archive_refused(tmp_path, dest):
    archive = _zip(tmp_path / "other.zip", {"other-1.0/setup.py": b"print()\n"})
    with pytest.raises(ValueError, match="not a NeuSight repository"):
        fetch.fetch(dest, source=archive, progress=False)
    _clean(dest)


def test_unsafe_member_refused(tmp_path, dest):
    files = _files()
    files["NeuSight-abc/../evil"] = b"boom"
    archive = _tar(tmp_path / "evil.tar.gz", files)
    with pytest.raises(ValueError, match="unsafe"):
        fetch.fetch(dest, source=archive, progress=False)
    _clean(dest)
    assert not (tmp_path / "out" / "evil").exists() and not (tmp_path / "evil").exists()


def test_unsafe_zip_member_refused(tmp_path, dest):
    archive = _zip(tmp_path / "evil.zip", {**_files(), "/abs/evil": b"boom"})
    with pytest.raises(ValueError, match="unsafe"):
        fetch.fetch(dest, source=archive, progress=False)
    _clean(dest)


def test_existing_dest_needs_force(tmp_path, dest):
    dest.mkdir()
    (dest / "keep.txt").write_text("old")
    archive = _tar(tmp_path / "a.tar.gz", _files())
    with pytest.raises(FileExistsError, match="--force"):
        fetch.fetch(dest, source=archive, progress=False)
    assert [p.name for p in dest.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["neusight"]
    fetch.fetch(dest, source=archive, force=True, progress=False)
    assert not (dest / "keep.txt").exists() and (dest / CONFIG).is_file()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["neusight", "neusight.lock.json"]


def test_failed_force_keeps_old_copy(tmp_path, dest):
    dest.mkdir()
    (dest / "keep.txt").write_text("old")
    archive = _zip(tmp_path / "other.zip", {"other/x.txt": b"x"})
    with pytest.raises(ValueError):
        fetch.fetch(dest, source=archive, force=True, progress=False)
    assert (dest / "keep.txt").read_text() == "old"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["neusight"]


@pytest.mark.parametrize("level", ["repo", "asplos"])
def test_folder_source(tmp_path, dest, level):
    repo = tmp_path / "copy"
    cfg = repo / CONFIG
    cfg.parent.mkdir(parents=True)
    cfg.write_text(json.dumps(T4))
    src = repo if level == "repo" else repo / "scripts" / "asplos"
    fetch.fetch(dest, source=src, progress=False)
    got = json.loads((paths.data_root(dest) / "data/device_configs/Tesla_T4.json").read_text())
    assert got == T4_FETCHED
    lock = fetch.read_lock(dest)
    assert lock["sha256"] is None and lock["source"] == str(src)
    assert json.loads(cfg.read_text()) == T4  # the source is left alone


def test_folder_not_a_repo_refused(tmp_path, dest):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a NeuSight repository"):
        fetch.fetch(dest, source=tmp_path / "empty", progress=False)
    _clean(dest)


def test_url_goes_through_pooch(tmp_path, dest, monkeypatch):
    archive = _tar(tmp_path / "a.tar.gz", _files())
    calls = []

    def fake_retrieve(url, known_hash=None, path=None, progressbar=False, **kw):
        calls.append((url, known_hash, Path(path), progressbar))
        return str(archive)

    monkeypatch.setattr(fetch.pooch, "retrieve", fake_retrieve)
    fetch.fetch(dest, sha256=_sha(archive), progress=False)
    entry = fetch.load_registry()
    assert calls == [(entry["url"], _sha(archive), tmp_path / "cache" / "downloads", False)]
    assert fetch.read_lock(dest)["source"] == entry["url"]
    fetch.fetch(dest, source="https://mirror.example/n.tar.gz", force=True, progress=False)
    assert calls[-1][0] == "https://mirror.example/n.tar.gz"


def test_registry():
    entry = fetch.load_registry()
    assert entry["repository"] == "sitar-lab/NeuSight" and entry["url"].endswith(".tar.gz")
    with pytest.raises(ValueError, match="Unknown dataset"):
        fetch.load_registry("nope")


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_truncated_archive_is_a_clear_error(tmp_path, dest, kind):
    archive = (_tar(tmp_path / "a.tar.gz", _files()) if kind == "tar"
               else _zip(tmp_path / "a.zip", _files()))
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(ValueError, match="damaged|neither a tar nor a zip"):
        fetch.fetch(dest, source=archive, progress=False)
    _clean(dest)


def test_no_network_is_a_clear_error(tmp_path, dest, monkeypatch):
    def offline(url, **kw):
        raise OSError("Failed to establish a new connection: Network is unreachable")

    monkeypatch.setattr(fetch.pooch, "retrieve", offline)
    with pytest.raises(ConnectionError, match="--source"):
        fetch.fetch(dest, progress=False)
    _clean(dest)


# --- the datasheet keys upstream lacks (TDP, Link_Bw) from datasets/neusight_extras.json ---

ASPLOS = "NeuSight-abc/scripts/asplos/data/"


def _upstream_like() -> dict[str, bytes]:
    """Device JSONs as upstream has them: no TDP nor Link_Bw, but a P4 that already has a TDP,
    a split copy of the T4, and a GPU the extras do not list."""
    p4 = {**T4, "Device": "Tesla P4", "TDP": 99}
    other = json.dumps({**T4, "Device": "Mystery GPU"}).encode()
    return {ASPLOS + "device_configs/Tesla_T4.json": json.dumps(T4).encode(),
            ASPLOS + "device_configs/Tesla_P4.json": json.dumps(p4).encode(),
            ASPLOS + "device_configs/Mystery_GPU.json": other,
            ASPLOS + "dataset/train/device_configs/Tesla_T4.json": json.dumps(T4).encode(),
            "NeuSight-abc/README.md": b"fake NeuSight\n"}


def _check_keys_added(dest: Path, files: dict[str, bytes]) -> None:
    cfgs = dest / "scripts" / "asplos" / "data"
    assert json.loads((cfgs / "device_configs/Tesla_T4.json").read_text()) == T4_FETCHED
    assert json.loads((cfgs / "dataset/train/device_configs/Tesla_T4.json").read_text()) == \
        T4_FETCHED
    # a key already there is kept; only the missing one is added
    p4 = json.loads((cfgs / "device_configs/Tesla_P4.json").read_text())
    assert p4["TDP"] == 99 and p4["Link_Bw"] == 32
    # a file the extras do not list is left byte for byte
    assert (cfgs / "device_configs/Mystery_GPU.json").read_bytes() == \
        files[ASPLOS + "device_configs/Mystery_GPU.json"]
    gpus = load_gpus(dest)
    assert (gpus["Tesla_T4"].tdp_w, gpus["Tesla_T4"].link_gbps) == (70, 32)
    assert gpus["Mystery_GPU"].tdp_w is None and gpus["Mystery_GPU"].link_gbps is None
    assert fetch.read_lock(dest)["datasheet_keys"] == {"source": "neusight_extras.json",
                                                       "files": 3}
    assert sorted(p.name for p in dest.parent.iterdir()) == ["neusight", "neusight.lock.json"]


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_fetched_device_jsons_get_the_missing_keys(tmp_path, dest, kind):
    files = _upstream_like()
    archive = (_tar(tmp_path / "a.tar.gz", files) if kind == "tar"
               else _zip(tmp_path / "a.zip", files))
    fetch.fetch(dest, source=archive, progress=False)
    _check_keys_added(dest, files)


def test_read_only_folder_source_gets_the_keys_and_is_left_alone(tmp_path, dest):
    files = _upstream_like()
    repo = tmp_path / "mirror"
    for name, data in files.items():
        path = repo / name.removeprefix("NeuSight-abc/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    walk = sorted(repo.rglob("*"), reverse=True)  # files before their folders
    for p in walk:
        p.chmod(0o555 if p.is_dir() else 0o444)
    repo.chmod(0o555)
    try:
        fetch.fetch(dest, source=repo, progress=False)
        _check_keys_added(dest, files)
        assert (repo / "scripts/asplos/data/device_configs/Tesla_T4.json").read_bytes() == \
            files[ASPLOS + "device_configs/Tesla_T4.json"]
    finally:
        for p in [repo, *reversed(walk)]:
            p.chmod(0o755 if p.is_dir() else 0o644)


@pytest.mark.parametrize("bad,words", [
    ({"Tesla_T4": {"source": "x", "keys": {"TDP": -70}}}, "'TDP'.*must be positive"),
    ({"Tesla_T4": {"source": "x", "keys": {"TDP": "70"}}}, "'TDP'.*must be a number"),
    ({"Tesla_T4": {"source": "x", "keys": {"Dev_Mem": 16}}}, "'Dev_Mem' is not an optional"),
    ({"Tesla_T4": {"keys": {"TDP": 70}}}, "needs 'source'"),
    ({"../T4": {"source": "x", "keys": {"TDP": 70}}}, "not a plain file stem")])
def test_bad_extras_file_refused_nothing_installed(tmp_path, dest, monkeypatch, bad, words):
    (tmp_path / "extras.json").write_text(json.dumps(bad))
    monkeypatch.setattr(fetch, "extras_path", lambda: tmp_path / "extras.json")
    archive = _tar(tmp_path / "a.tar.gz", _files())
    with pytest.raises(ValueError, match=r"extras\.json.*" + words):
        fetch.fetch(dest, source=archive, progress=False)
    _clean(dest)


def test_real_extras_match_the_shared_copy():
    extras = fetch.load_extras()
    assert all(set(keys) == {"TDP", "Link_Bw"} for keys in extras.values())
    if not SHARED_DEVICES.is_dir():
        pytest.skip(f"nslib data not here: NeuSight (no shared copy at {SHARED_DEVICES})")
    shared = {p.stem: json.loads(p.read_text()) for p in SHARED_DEVICES.glob("*.json")}
    assert set(extras) == set(shared)
    for stem, keys in extras.items():
        assert keys == {k: shared[stem][k] for k in keys}, stem


def test_cli_says_when_no_hash_was_checked(tmp_path, dest, capsys):
    from nslib.cli import main
    archive = _tar(tmp_path / "a.tar.gz", _files())
    assert fetch.load_registry().get("sha256") is None   # nothing pinned the archive yet
    assert main(["fetch", "--data", str(dest), "--source", str(archive)]) == 0
    err = capsys.readouterr().err
    assert "not checked against a pinned SHA-256" in err
    assert main(["fetch", "--data", str(dest), "--source", str(archive), "--sha256",
                 _sha(archive), "--force"]) == 0
    assert "not checked" not in capsys.readouterr().err
