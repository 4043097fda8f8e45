"""Download (or copy) the pinned NeuSight repository into the data folder: ``nslib fetch``.

The pin lives in ``datasets/registry.json``. Archives are checked against a SHA-256, unpacked
into a temporary folder beside the destination, checked to be a NeuSight repository and only
then renamed into place, so the data folder is either the old copy or the complete new one.
A lock file ``<dest>.lock.json`` beside the data records what was fetched.
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

URL_SCHEMES = ("http", "https", "ftp", "sftp")
NO_NETWORK_HINT = ("Without a network, pass --source with a local archive or folder of the "
                   "repository, or point NSLIB_DATA (--data) at a copy.")
# what a cut-off or damaged archive raises while it is read
ARCHIVE_ERRORS = (tarfile.ReadError, EOFError, zipfile.BadZipFile, zlib.error)
REPO_MARKER = paths.ASPLOS / "data" / "device_configs"


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


def fetch(dest: str | os.PathLike | None = None, source: str | os.PathLike | None = None,
          sha256: str | None = None, force: bool = False, progress: bool = True) -> Path:
    """Install the NeuSight repository at ``dest`` (default ``datasets/neusight``); return ``dest``.

    ``source``: None (the registry URL), an http(s) mirror URL, a local ``.tar.gz``/``.tgz``/
    ``.zip`` archive, or a local folder (the repository or its ``scripts/asplos`` folder).
    ``sha256`` (hex) overrides the registry's hash; archives whose hash differs are refused
    (``ValueError``). An existing ``dest`` raises ``FileExistsError`` unless ``force``.
    ``progress`` shows pooch's download bar. Writes ``<dest>.lock.json`` (see :func:`read_lock`).
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
        install(_stage(scratch, archive, folder, label), dest, force, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lock = {"source": label, "sha256": digest, "commit": entry.get("commit"),
            "fetched_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    paths.atomic_write_text(lock_path(dest), json.dumps(lock, indent=2) + "\n")
    return dest
