"""Download (or copy) the pinned NeuSight repository into the data folder: ``nslib fetch``.

The pin lives in ``datasets/registry.json``. Archives are checked against a SHA-256, unpacked
into a temporary folder beside the destination, checked to be a NeuSight repository and only
then renamed into place, so the data folder is either the old copy or the complete new one.
A lock file ``<dest>.lock.json`` beside the data records what was fetched.

Upstream's device JSONs lack two vendor-datasheet figures the project uses, ``TDP`` (maximum
board power, W) and ``Link_Bw`` (GPU-to-GPU link bandwidth, GB/s both directions):
``datasets/neusight_extras.json`` holds them per file stem with their source, and the staged
copy's device JSONs get each key they lack (:func:`add_datasheet_keys`) before it is installed.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tarfile
import tempfile
import zipfile
import zlib
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

import pooch

from nslib.data import paths
from nslib.data.checks import check_float
from nslib.data.gpus import OPTIONAL_FIELDS

URL_SCHEMES = ("http", "https", "ftp", "sftp")
NO_NETWORK_HINT = ("Without a network, pass --source with a local archive or folder of the "
                   "repository, or point NSLIB_DATA (--data) at a copy.")
# what a cut-off or damaged archive raises while it is read
ARCHIVE_ERRORS = (tarfile.ReadError, EOFError, zipfile.BadZipFile, zlib.error)
REPO_MARKER = paths.ASPLOS / "data" / "device_configs"
# the folders of device JSONs, relative to the data root (scripts/asplos): the datasheets and
# the copies that name each split's GPUs
DEVICE_CONFIG_DIRS = (Path("data") / "device_configs",
                      Path("data") / "dataset" / "train" / "device_configs",
                      Path("data") / "dataset" / "test" / "device_configs")


def registry_path() -> Path:
    """The registry file, ``<project>/datasets/registry.json``."""
    return paths.PROJECT_ROOT / "datasets" / "registry.json"


def load_registry(name: str = "neusight") -> dict:
    """The registry entry ``name`` (keys: repository, commit, url, sha256, strip_prefix).

    Raises ``ValueError`` when the registry has no entry of that name.
    """
    entries = json.loads(registry_path().read_text(encoding="utf-8"))
    if name not in entries:
        raise ValueError(f"Unknown dataset {name!r} in {registry_path()}; "
                         f"known: {', '.join(sorted(entries)) or 'none'}")
    return dict(entries[name])


def extras_path() -> Path:
    """The datasheet keys upstream lacks, ``<project>/datasets/neusight_extras.json``."""
    return paths.PROJECT_ROOT / "datasets" / "neusight_extras.json"


def load_extras() -> dict[str, dict]:
    """``{file stem: {JSON key: value}}``: the optional datasheet keys (``TDP`` W, ``Link_Bw``
    GB/s, any of :data:`nslib.data.gpus.OPTIONAL_FIELDS`) to add to the fetched device JSONs.

    Each entry is ``{"source": citation, "keys": {...}}``; ``ValueError`` naming the file, the
    stem and the key when the stem is not a plain name, the source is missing, a key is not an
    optional datasheet key, or a value is not a positive finite number.
    """
    path = extras_path()
    out = {}
    for stem, item in json.loads(path.read_text(encoding="utf-8")).items():
        where = f"{path} [{stem}]"
        if not stem or "/" in stem or "\\" in stem or not safe_member_name(stem):
            raise ValueError(f"{where}: not a plain file stem; fix the file")
        if not isinstance(item, dict) or not str(item.get("source") or "").strip() \
                or not isinstance(item.get("keys"), dict) or not item["keys"]:
            raise ValueError(f"{where}: needs 'source' (where the figures are published) and "
                             "'keys' (a non-empty object {JSON key: value}); fix the file")
        keys = {}
        for k, v in item["keys"].items():
            if k not in OPTIONAL_FIELDS:
                raise ValueError(f"{where}: key {k!r} is not an optional datasheet key "
                                 f"({', '.join(OPTIONAL_FIELDS)}); fix the file")
            try:
                check_float(f"key '{k}' ({OPTIONAL_FIELDS[k][1]})", v, positive=True)
            except ValueError as e:
                raise ValueError(f"{where}: {e}; fix the file") from None
            keys[k] = v  # as written (70, not 70.0)
        out[stem] = keys
    return out


def add_datasheet_keys(root: Path, extras: dict[str, dict] | None = None) -> int:
    """Add to each device JSON under data root ``root`` (:data:`DEVICE_CONFIG_DIRS`) the keys
    of its stem in ``extras`` (default :func:`load_extras`) that it lacks; a key already there
    is never overwritten, a file whose stem is not listed is left as it is. Each file is
    rewritten atomically (4-space JSON, the new keys last); return how many were changed.
    ``ValueError`` naming the file when a listed one is not a JSON object."""
    extras = load_extras() if extras is None else extras
    changed = 0
    for rel in DEVICE_CONFIG_DIRS:
        folder = root / rel
        if not folder.is_dir():
            continue
        for cfg in sorted(folder.glob("*.json")):
            add = extras.get(cfg.stem)
            if not add:
                continue
            try:
                raw = json.loads(cfg.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"{cfg}: not a valid device JSON ({exc}); nothing was "
                                 "installed") from None
            if not isinstance(raw, dict):
                raise ValueError(f"{cfg}: a device JSON must be an object; nothing was installed")
            missing = {k: v for k, v in add.items() if k not in raw}
            if missing:
                with _writable(folder):
                    paths.atomic_write_text(cfg, json.dumps({**raw, **missing}, indent=4) + "\n")
                changed += 1
    return changed


@contextlib.contextmanager
def _writable(folder: Path):
    """Let the owner write into ``folder`` for a while (a copy of a read-only mirror keeps its
    modes), then give it its mode back."""
    mode = folder.stat().st_mode
    if os.access(folder, os.W_OK):
        yield
        return
    os.chmod(folder, mode | 0o200)
    try:
        yield
    finally:
        os.chmod(folder, mode)


def lock_path(dest: str | os.PathLike | None = None) -> Path:
    """The lock file of data folder ``dest``: ``dest.parent / (dest.name + '.lock.json')``."""
    dest = abs_path(dest if dest is not None else paths.DEFAULT_DATA)
    return dest.parent / (dest.name + ".lock.json")


def read_lock(dest: str | os.PathLike | None = None) -> dict | None:
    """The lock record written by the last :func:`fetch` into ``dest``, or None if there is none."""
    path = lock_path(dest)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def abs_path(path: str | os.PathLike) -> Path:
    """``path`` made absolute (``~`` expanded), without resolving links."""
    return Path(os.path.abspath(Path(path).expanduser()))


def _is_url(source: str) -> bool:
    return urlparse(source).scheme.lower() in URL_SCHEMES or source.startswith("doi:")


@contextlib.contextmanager
def _quiet_pooch():
    """Silence pooch's INFO messages (its progress bar, if asked for, still shows)."""
    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def download(url: str, expected: str | None, progress: bool, hint: str = NO_NETWORK_HINT) -> Path:
    """Download ``url`` into the cache (``downloads/``) through pooch, checking ``expected``.

    ``ConnectionError`` (ending with ``hint``: what to do offline) when it cannot be reached."""
    with _quiet_pooch():
        try:
            got = pooch.retrieve(url, known_hash=expected, path=paths.cache_dir("downloads"),
                                 progressbar=progress)
        except ValueError as exc:  # pooch's message names both hashes
            raise ValueError(f"Download from {url} refused: {exc}") from exc
        except OSError as exc:  # no network, refused connection, HTTP error (requests' errors)
            raise ConnectionError(f"Could not download {url} ({type(exc).__name__}: "
                                  f"{str(exc)[:160]}). {hint}") from None
    return Path(got)


def check_hash(archive: Path, expected: str | None) -> str:
    """SHA-256 (hex) of ``archive``; ``ValueError`` if ``expected`` is given and differs."""
    digest = pooch.file_hash(str(archive), alg="sha256")
    if expected:
        want = expected.split(":", 1)[1] if ":" in expected else expected
        if digest.lower() != want.lower():
            raise ValueError(f"SHA-256 mismatch for {archive}: expected {want}, got {digest}. "
                             "Nothing was unpacked.")
    return digest


def safe_member_name(name: str) -> bool:
    """True if archive member ``name`` stays inside the folder it is unpacked into."""
    pure = PurePosixPath(name.replace("\\", "/"))
    return not (pure.is_absolute() or ".." in pure.parts or ":" in (pure.parts or ("",))[0])


def _safe_tar_member(member: tarfile.TarInfo) -> bool:
    if not safe_member_name(member.name):
        return False
    if member.issym():  # a link target is resolved relative to the link's own folder
        target = os.path.normpath(PurePosixPath(member.name).parent / member.linkname)
        return not member.linkname.startswith("/") and safe_member_name(target)
    if member.islnk():
        return safe_member_name(member.linkname)
    return member.isfile() or member.isdir()


def _unpack(archive: Path, into: Path) -> None:
    """Unpack a tar (any compression) or zip ``archive`` into the new folder ``into``.

    Refuses (``ValueError``) members with absolute paths, ``..`` parts, escaping links or
    device files, before anything is written.
    """
    into.mkdir()
    try:
        _extract(archive, into)
    except ARCHIVE_ERRORS as exc:
        raise damaged_archive(archive, exc) from None


def damaged_archive(archive: Path, exc: Exception) -> ValueError:
    """The error for an archive that cannot be read (``exc``, one of :data:`ARCHIVE_ERRORS`)."""
    return ValueError(f"{archive} is damaged ({type(exc).__name__}: {exc}); it was probably "
                      "cut off while downloading: delete it and fetch again. Nothing was "
                      "installed.")


def _extract(archive: Path, into: Path) -> None:
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            bad = [n for n in zf.namelist() if not safe_member_name(n)]
            if bad:
                raise ValueError(f"Refusing {archive}: unsafe member paths {bad[:5]}")
            zf.extractall(into)
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive, "r:*") as tf:
            members = tf.getmembers()
            bad = [m.name for m in members if not _safe_tar_member(m)]
            if bad:
                raise ValueError(f"Refusing {archive}: unsafe members {bad[:5]}")
            tf.extractall(into, members=members, filter="data")
    else:
        raise ValueError(f"{archive} is neither a tar nor a zip archive")


def _repo_root(folder: Path) -> Path:
    """``folder``, or its single top-level sub-folder (e.g. ``NeuSight-<commit>/``)."""
    if (folder / paths.ASPLOS).is_dir():
        return folder
    entries = list(folder.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        return entries[0]
    return folder


def _check_repo(root: Path, what: str, allow_asplos: bool = False) -> None:
    """``ValueError`` unless ``root`` holds ``scripts/asplos/data/device_configs``.

    With ``allow_asplos`` the ``scripts/asplos`` folder itself (``data/device_configs``) passes too.
    """
    if (root / REPO_MARKER).is_dir():
        return
    if allow_asplos and (root / "data" / "device_configs").is_dir():
        return
    raise ValueError(f"{what} is not a NeuSight repository: no {REPO_MARKER.as_posix()} in it. "
                     "Nothing was installed.")


def install(new: Path, dest: Path, force: bool, scratch: Path) -> None:
    """Rename ``new`` to ``dest``; an existing ``dest`` is moved into ``scratch`` first (force).

    ``new`` and ``scratch`` must lie on ``dest``'s file system (a folder beside it), so each
    step is one rename: ``dest`` is the old copy or the new one, never a mix."""
    if dest.exists() or dest.is_symlink():
        if not force:
            raise FileExistsError(f"{dest} already exists; pass --force (force=True) to replace it")
        old = scratch / "old"
        os.replace(dest, old)
        try:
            os.replace(new, dest)
        except BaseException:
            os.replace(old, dest)
            raise
    else:
        os.replace(new, dest)


def _resolve_source(source, entry: dict, expected: str | None, progress: bool):
    """``(lock source string, local archive or None, local folder or None, archive sha256)``."""
    if source is None or (isinstance(source, str) and _is_url(source)):
        url = entry["url"] if source is None else source
        archive = download(url, expected, progress)
        return url, archive, None, check_hash(archive, expected)
    text = str(source)
    path = abs_path(urlparse(text).path if text.startswith("file://") else text)
    if path.is_dir():
        return str(path), None, path, None
    if path.is_file():
        return str(path), path, None, check_hash(path, expected)
    raise FileNotFoundError(f"Fetch source {path} does not exist (expected a URL, an archive "
                            "or a folder)")


def _stage(scratch: Path, archive: Path | None, folder: Path | None, label: str) -> Path:
    """Unpack ``archive`` (or copy ``folder``) under ``scratch``; return the checked data root."""
    if archive is not None:
        _unpack(archive, scratch / "unpacked")
        root = _repo_root(scratch / "unpacked")
        _check_repo(root, f"The archive {label}")
        return root
    _check_repo(folder, f"The folder {label}", allow_asplos=True)
    shutil.copytree(folder, scratch / "copy", ignore=shutil.ignore_patterns(".git"))
    return scratch / "copy"


def _data_root(root: Path) -> Path:
    """The staged copy's ``scripts/asplos`` folder (``root`` itself for a copy of that folder)."""
    return root / paths.ASPLOS if (root / REPO_MARKER).is_dir() else root


def fetch(dest: str | os.PathLike | None = None, source: str | os.PathLike | None = None,
          sha256: str | None = None, force: bool = False, progress: bool = True) -> Path:
    """Install the NeuSight repository at ``dest`` (default ``datasets/neusight``); return ``dest``.

    ``source``: None (the registry URL), an http(s) mirror URL, a local ``.tar.gz``/``.tgz``/
    ``.zip`` archive, or a local folder (the repository or its ``scripts/asplos`` folder).
    ``sha256`` (hex) overrides the registry's hash; archives whose hash differs are refused
    (``ValueError``). An existing ``dest`` raises ``FileExistsError`` unless ``force``.
    ``progress`` shows pooch's download bar. The device JSONs get the datasheet keys of
    ``datasets/neusight_extras.json`` they lack (:func:`add_datasheet_keys`) before the copy is
    installed. Writes ``<dest>.lock.json`` (see :func:`read_lock`).
    """
    entry = load_registry()
    dest = abs_path(dest if dest is not None else paths.DEFAULT_DATA)
    if (dest.exists() or dest.is_symlink()) and not force:
        raise FileExistsError(f"{dest} already exists; pass --force (force=True) to replace it")
    expected = sha256 or entry.get("sha256")
    label, archive, folder, digest = _resolve_source(source, entry, expected, progress)
    if folder is not None and dest.parent.resolve().is_relative_to(folder.resolve()):
        raise ValueError(f"Cannot copy {folder} into {dest}, which lies inside it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp"))
    try:
        staged = _stage(scratch, archive, folder, label)
        added = add_datasheet_keys(_data_root(staged))
        install(staged, dest, force, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lock = {"source": label, "sha256": digest, "commit": entry.get("commit"),
            "datasheet_keys": {"source": extras_path().name, "files": added},
            "fetched_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    paths.atomic_write_text(lock_path(dest), json.dumps(lock, indent=2) + "\n")
    return dest
