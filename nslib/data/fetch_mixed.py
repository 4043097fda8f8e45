"""Assemble the 16-bit measurements folder (``NSLIB_MIXED``): ``nslib fetch --mixed``.

``datasets/mixed_registry.json`` pins each upstream repository (its folder name in the data is
the entry's name): the commit, the archive URL and the SHA-256 of every file the project reads,
paths relative to the repository root. Only those files are taken from the archive (or from a
local mirror folder), and each is checked, so the pin holds however the archive was compressed;
an archive SHA-256 in the registry (``sha256``) is checked too, and the lock file records the
one seen. ``datasets/mixed_datasheets.json`` holds the datasheets (NeuSight JSON format plus
``Bf16FLOPs``, ``TDP`` and ``Link_Bw``, each with its published source), written as
``device_configs/<stem>.json``.

Everything is built in a temporary folder beside the destination and renamed into place only
once every file checked out, so the data folder is the old copy or the complete new one. A lock
file ``<dest>.lock.json`` beside it records what was fetched.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import zipfile
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from nslib.data import fetch, paths
from nslib.data.gpus import gpu_from_dict

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
LFS_POINTER = b"version https://git-lfs"
OFFLINE_HINT = ("Without a network, pass --source FOLDER: a copy laid out like the data "
                "(each repository as <name>/ or <name>.tar.gz beside the others), or point "
                "NSLIB_MIXED (--mixed) at an existing copy.")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def registry_path() -> Path:
    """The pins of the upstream repositories, ``<project>/datasets/mixed_registry.json``."""
    return paths.PROJECT_ROOT / "datasets" / "mixed_registry.json"


def datasheets_path() -> Path:
    """The datasheets with their sources, ``<project>/datasets/mixed_datasheets.json``."""
    return paths.PROJECT_ROOT / "datasets" / "mixed_datasheets.json"


def bad_file_pins(name: str, files) -> list[str]:
    if not isinstance(files, dict) or not files:
        return [f"{name}: 'files' must be a non-empty object {{path: sha256}}"]
    return [f"{name}: file {rel!r}: " + ("unsafe path" if not safe_rel(rel) else "bad sha256")
            for rel, digest in files.items()
            if not safe_rel(rel) or not (isinstance(digest, str) and _HEX64.fullmatch(digest))]


def safe_rel(rel) -> bool:
    # the normal form only: no "./", "//", trailing "/" or backslashes
    return (isinstance(rel, str) and bool(rel) and fetch.safe_member_name(rel)
            and "\\" not in rel and PurePosixPath(rel).as_posix() == rel)


def load_mixed_registry() -> dict[str, dict]:
    """The repository pins: ``{name: {repository, commit, url, sha256, license, files}}``.

    ``files`` maps each path (relative to the repository root) to its SHA-256 (hex). Raises
    ``ValueError`` naming the entry when a field is missing or a path or hash is malformed.
    """
    path = registry_path()
    entries = json.loads(path.read_text(encoding="utf-8"))
    problems = []
    for name, entry in entries.items():
        if not safe_rel(name) or "/" in name:
            problems.append(f"entry name {name!r} is not a plain folder name")
        problems += [f"{name}: field {k!r} is missing" for k in
                     ("repository", "commit", "url", "files") if k not in entry]
        problems += bad_file_pins(name, entry.get("files"))
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems[:5]) + ". Fix the registry.")
    return entries


def load_datasheets(path: str | os.PathLike | None = None,
                    need_bf16: bool = True) -> dict[str, dict]:
    """The datasheets to write, ``{file stem: NeuSight-format dict}``, each checked as a GPU
    spec (``ValueError`` naming the stem and field otherwise) and cited (``source``).

    ``path``: a datasheets file of the same format (default :func:`datasheets_path`);
    ``need_bf16``: refuse a datasheet without ``Bf16FLOPs`` (the 16-bit data needs it)."""
    path = Path(path) if path is not None else datasheets_path()
    out = {}
    for stem, item in json.loads(path.read_text(encoding="utf-8")).items():
        where = f"{path} [{stem}]"
        if not safe_rel(stem) or "/" in stem:
            raise ValueError(f"{where}: not a plain file stem")
        if not isinstance(item, dict) or not str(item.get("source") or "").strip():
            raise ValueError(f"{where}: needs 'source' (where the figures are published) "
                             "and 'datasheet'")
        gpu = gpu_from_dict(item.get("datasheet"), source=where, key=stem)
        if need_bf16 and gpu.bf16_gflops is None:
            raise ValueError(f"{where}: field 'Bf16FLOPs' is missing; the 16-bit data needs it")
        out[stem] = dict(item["datasheet"])
    return out


def mixed_dest(dest: str | os.PathLike | None = None) -> Path:
    """Where the 16-bit data goes: ``dest``, else ``NSLIB_MIXED``, else ``datasets/mixed``."""
    return fetch.abs_path(dest if dest is not None
                            else os.environ.get("NSLIB_MIXED") or paths.DEFAULT_MIXED)


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pin_files(folder: str | os.PathLike, relpaths=None) -> dict[str, str]:
    """``{relative path: SHA-256}`` of ``relpaths`` under ``folder`` (default: every file but
    ``.git/``): the ``files`` pin of a registry entry, from a checked copy (for maintainers)."""
    root = Path(folder)
    if relpaths is None:
        relpaths = [p.relative_to(root).as_posix() for p in sorted(root.rglob("*"))
                    if p.is_file() and ".git" not in p.relative_to(root).parts]
    return {rel: file_sha256(root / rel) for rel in relpaths}


def _locate(source: Path | None, name: str, entry: dict, progress: bool):
    """``(label, archive or None, folder or None, archive sha256 or None)`` for one repository."""
    if source is None:
        archive = fetch.download(entry["url"], entry.get("sha256"), progress, OFFLINE_HINT)
        return entry["url"], archive, None, fetch.check_hash(archive, entry.get("sha256"))
    if (source / name).is_dir():
        return str(source / name), None, source / name, None
    for suffix in ARCHIVE_SUFFIXES:
        archive = source / (name + suffix)
        if archive.is_file():
            return str(archive), archive, None, fetch.check_hash(archive, entry.get("sha256"))
    raise FileNotFoundError(f"{source} has no {name}/ folder nor {name}.tar.gz/.zip archive "
                            f"({entry['repository']} at commit {entry['commit']}); nothing was "
                            "installed. Lay the mirror out like the data folder.")


def copy_from_folder(folder: Path, files: dict, out: Path) -> list[str]:
    """Copy the pinned ``files`` from a repository folder into ``out``; return those missing."""
    missing = []
    for rel in files:
        src = folder / rel
        if not src.is_file():
            missing.append(rel)
            continue
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, out / rel)
    return missing


def _strip_top(names: list[str]) -> dict[str, str]:
    """``{path in the repository: member name}``; GitHub archives hold one top folder."""
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) == 1 and all("/" in n for n in names):
        return {n.split("/", 1)[1]: n for n in names}
    return {n: n for n in names}


def copy_from_archive(archive: Path, files: dict, out: Path) -> list[str]:
    """Extract only the pinned ``files`` (regular files) of a tar or zip into ``out``; return
    those missing. Nothing outside ``out`` is written: paths come from the registry."""
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                found = _strip_top([i.filename for i in zf.infolist() if not i.is_dir()])
                return _write_members(files, out, found, zf.open)
        if tarfile.is_tarfile(archive):
            with tarfile.open(archive, "r:*") as tf:
                regular = {m.name: m for m in tf.getmembers() if m.isfile()}
                found = _strip_top(list(regular))
                return _write_members(files, out, found, lambda n: tf.extractfile(regular[n]))
    except fetch.ARCHIVE_ERRORS as exc:
        raise fetch.damaged_archive(archive, exc) from None
    raise ValueError(f"{archive} is neither a tar nor a zip archive; nothing was installed")


def _write_members(files: dict, out: Path, found: dict, opener) -> list[str]:
    missing = []
    for rel in files:
        if rel not in found:
            missing.append(rel)
            continue
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        with opener(found[rel]) as src, open(out / rel, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return missing


def _check_files(name: str, entry: dict, out: Path, label: str, missing: list[str]) -> None:
    """``ValueError`` naming every missing or altered file (expected vs got SHA-256)."""
    what = f"{entry['repository']} at commit {entry['commit']}"
    problems = [f"{rel}: missing" for rel in missing]
    for rel, want in entry["files"].items():
        if rel in missing:
            continue
        bad = pin_mismatch(out / rel, rel, want)
        if bad:
            problems.append(bad)
    if problems:
        raise ValueError(
            f"{name} from {label} does not match the pins of {what} in {registry_path()} "
            f"{listed(problems, len(entry['files']))}. Nothing was installed. Fetch "
            f"{what} again (a Git LFS repository needs `git lfs pull` in a clone, then "
            "--source with that clone), or point NSLIB_MIXED (--mixed) at a checked copy.")


def listed(problems: list[str], total: int) -> str:
    """``(n of total files): `` and the first four problems, for a refused fetch's message."""
    return (f"({len(problems)} of {total} files): " + "; ".join(problems[:4])
            + ("; ..." if len(problems) > 4 else ""))


def pin_mismatch(path: Path, rel: str, want: str) -> str | None:
    """``None`` when the file at ``path`` has SHA-256 ``want``, else the problem, naming
    ``rel`` with the expected and the actual hash (and a Git LFS pointer for what it is)."""
    got = file_sha256(path)
    if got == want:
        return None
    lfs = path.read_bytes()[:len(LFS_POINTER)] == LFS_POINTER
    return (f"{rel}: SHA-256 expected {want}, got {got}"
            + (" (a Git LFS pointer, not the file)" if lfs else ""))


def write_datasheets(folder: Path, sheets: dict[str, dict] | None = None) -> int:
    """Write ``sheets`` (default :func:`load_datasheets`) as ``folder/<stem>.json``."""
    folder.mkdir(parents=True)
    sheets = load_datasheets() if sheets is None else sheets
    for stem, sheet in sheets.items():
        (folder / f"{stem}.json").write_text(json.dumps(sheet, indent=4) + "\n",
                                             encoding="utf-8")
    return len(sheets)


def _assemble(new: Path, source: Path | None, progress: bool) -> dict:
    """Build the data in ``new``; return the lock record of each repository."""
    registry = load_mixed_registry()
    # every repository located (downloaded) before any is copied: a missing one fails fast
    found = {name: _locate(source, name, entry, progress) for name, entry in registry.items()}
    record = {"repositories": {}}
    for name, entry in registry.items():
        label, archive, folder, digest = found[name]
        out = new / name
        out.mkdir(parents=True)
        missing = (copy_from_archive(archive, entry["files"], out) if archive is not None
                   else copy_from_folder(folder, entry["files"], out))
        _check_files(name, entry, out, label, missing)
        record["repositories"][name] = {
            "repository": entry["repository"], "commit": entry["commit"], "source": label,
            "archive_sha256": digest, "files": len(entry["files"])}
    record["datasheets"] = {"source": datasheets_path().name,
                            "files": write_datasheets(new / "device_configs")}
    return record


def fetch_mixed(dest: str | os.PathLike | None = None, source: str | os.PathLike | None = None,
                force: bool = False, progress: bool = True) -> Path:
    """Install the 16-bit data at ``dest`` (see :func:`mixed_dest`); return ``dest``.

    ``source``: None (download each registry URL through pooch, cached under
    ``$NSLIB_CACHE/downloads``) or a local folder laid out like the data: per repository a
    ``<name>/`` folder (a clone or a copy) or a ``<name>.tar.gz``/``.zip`` archive. Every
    pinned file is checked (``ValueError`` naming it, expected vs got); an existing ``dest``
    raises ``FileExistsError`` unless ``force``. Writes ``<dest>.lock.json``.
    """
    dest = mixed_dest(dest)
    if (dest.exists() or dest.is_symlink()) and not force:
        raise FileExistsError(f"{dest} already exists; pass --force (force=True) to replace it")
    if source is not None:
        source = fetch.abs_path(source)
        if not source.is_dir():
            names = " and ".join(f"{n}/" for n in load_mixed_registry())
            raise FileNotFoundError(f"Fetch source {source} is not a folder: --source with "
                                    f"--mixed takes a folder holding {names} (folders, or "
                                    ".tar.gz/.zip archives of the same names)")
    return build_and_install(dest, force, lambda new, scratch: _assemble(new, source, progress))


def build_and_install(dest: Path, force: bool, build) -> Path:
    """``build(new, scratch)`` fills the folder ``new`` (``scratch``: a temporary folder beside
    ``dest`` for its own use) and returns the lock record; ``new`` is then renamed to ``dest``
    (:func:`nslib.data.fetch.install`) and ``<dest>.lock.json`` written. A failure leaves the
    old ``dest`` (or nothing) and no temporary folder. Returns ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp"))
    try:
        record = build(scratch / "new", scratch)
        fetch.install(scratch / "new", dest, force, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lock = {**record, "fetched_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    paths.atomic_write_text(fetch.lock_path(dest), json.dumps(lock, indent=2) + "\n")
    return dest
