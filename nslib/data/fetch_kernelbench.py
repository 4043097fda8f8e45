"""Assemble the KernelBench timings folder (``NSLIB_KERNELBENCH``): ``nslib fetch --kernelbench``.

``datasets/kernelbench_registry.json`` pins, per campaign (a GPU folder of KernelBench's
``results/timing/``), the commit of its timing file and the commit of the problem files timed,
the GitHub archive URL of each commit, the upstream path prefix of the problems
(``KernelBench/``: ``KernelBench/level<N>/<file>.py`` becomes ``<campaign>/level<N>/<file>.py``)
and the SHA-256 of every file written, paths relative to the data folder; ``license`` pins
upstream's ``LICENSE``. ``<campaign>/source.json`` is written from the registry's fields (and
checked against its pin too). ``datasets/kernelbench_datasheets.json`` holds the datasheets
(the project's own cited facts, not upstream files), written as ``device_configs/<stem>.json``.

The build and the install are :mod:`nslib.data.fetch_mixed`'s: only the pinned files are taken
from each archive (or mirror), each is checked, and the folder is renamed into place only once
every file matched; ``<dest>.lock.json`` records what was fetched.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from nslib.data import fetch, paths
from nslib.data.fetch_mixed import (ARCHIVE_SUFFIXES, bad_file_pins, copy_from_archive,
                                    copy_from_folder, safe_rel, write_datasheets,
                                    build_and_install, file_sha256, listed,
                                    load_datasheets, pin_mismatch)
from nslib.data.kernelbench import DEFAULT_KERNELBENCH, LEVELS, TIMING_FILE

REPOSITORY = "ScalingIntelligence/KernelBench"
PROBLEMS_PREFIX = "KernelBench/"  # upstream: KernelBench/level<N>/<N>_<Name>.py
SOURCE_KEYS = ("repository", "timing_file", "timing_commit", "problems_commit", "timing")
OFFLINE_HINT = ("Without a network, pass --source FOLDER: a copy laid out like the data "
                "(<campaign>/ folders and LICENSE), or per commit a <commit>/ clone or a "
                "<commit>.tar.gz archive; or point NSLIB_KERNELBENCH at an existing copy.")
_LEVEL_FILE = re.compile(r"level(\d)/([^/]+\.py)")
_COMMIT = re.compile(r"[0-9a-f]{7,40}")


def registry_path() -> Path:
    """The pins, ``<project>/datasets/kernelbench_registry.json``."""
    return paths.PROJECT_ROOT / "datasets" / "kernelbench_registry.json"


def datasheets_path() -> Path:
    """The datasheets with their sources, ``<project>/datasets/kernelbench_datasheets.json``."""
    return paths.PROJECT_ROOT / "datasets" / "kernelbench_datasheets.json"


def archive_url(repository: str, commit: str) -> str:
    return f"https://github.com/{repository}/archive/{commit}.tar.gz"


def kernelbench_dest(dest: str | os.PathLike | None = None) -> Path:
    """Where the data goes: ``dest``, else ``NSLIB_KERNELBENCH``, else ``datasets/kernelbench``."""
    return fetch.abs_path(dest if dest is not None
                          else os.environ.get("NSLIB_KERNELBENCH") or DEFAULT_KERNELBENCH)


def load_kernelbench_registry() -> dict:
    """``{"license": {repository, commit, path, url, sha256}, "campaigns": {name: {repository,
    timing_file, timing_commit, problems_commit, timing, problems_prefix, archives, files}}}``;
    ``ValueError`` naming the entry when a field is missing or a path or hash is malformed."""
    path = registry_path()
    reg = json.loads(path.read_text(encoding="utf-8"))
    problems = []
    lic = reg.get("license")
    if not isinstance(lic, dict):
        problems.append("'license' must be an object")
    else:
        problems += [f"license: field {k!r} is missing" for k in
                     ("repository", "commit", "path", "url", "sha256") if k not in lic]
        problems += bad_file_pins("license", {lic.get("path"): lic.get("sha256")})
    camps = reg.get("campaigns")
    if not isinstance(camps, dict) or not camps:
        problems.append("'campaigns' must be a non-empty object")
        camps = {}
    for name, entry in camps.items():
        if not safe_rel(name) or "/" in name or name in ("device_configs", "LICENSE"):
            problems.append(f"campaign name {name!r} is not a plain folder name")
            continue
        missing = [k for k in (*SOURCE_KEYS, "problems_prefix", "archives", "files")
                   if k not in entry]
        problems += [f"{name}: field {k!r} is missing" for k in missing]
        if missing:
            continue
        for key in ("timing_commit", "problems_commit"):
            if not _COMMIT.fullmatch(str(entry[key])):
                problems.append(f"{name}: {key} {entry[key]!r} is not a commit hash")
            elif entry[key] not in entry["archives"]:
                problems.append(f"{name}: no archive URL for {key} {entry[key]}")
        problems += bad_file_pins(name, entry["files"])
        if isinstance(entry["files"], dict):
            for rel in entry["files"]:
                if not rel.startswith(f"{name}/") or _origin(entry, rel[len(name) + 1:]) is None:
                    problems.append(f"{name}: file {rel!r} is not one of the campaign's files")
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems[:5]) + ". Fix the registry.")
    return reg


def _origin(entry: dict, rel: str):
    """``(commit, upstream path)`` of a campaign file (``rel`` inside the campaign folder),
    ``("generated", None)`` for ``source.json``, None for a file of no known origin."""
    if rel == TIMING_FILE:
        return entry["timing_commit"], entry["timing_file"]
    if rel == "source.json":
        return "generated", None
    m = _LEVEL_FILE.fullmatch(rel)
    if m and int(m.group(1)) in LEVELS:
        return entry["problems_commit"], entry["problems_prefix"] + rel
    return None


def source_json(entry: dict) -> str:
    """The text of ``<campaign>/source.json`` from a registry entry."""
    return json.dumps({k: entry[k] for k in SOURCE_KEYS}, indent=2) + "\n"


def pin_kernelbench(folder: str | os.PathLike) -> dict:
    """The registry (see :func:`load_kernelbench_registry`) of a checked copy of the data
    (for maintainers): every campaign's ``source.json`` fields and the SHA-256 of each of its
    files, and of ``LICENSE`` (pinned at the timing commit of the first campaign by name).
    ``ValueError`` for a file of
    no known upstream origin."""
    root = Path(folder)
    campaigns = {}
    for src in sorted(root.glob("*/source.json")):
        name = src.parent.name
        meta = json.loads(src.read_text(encoding="utf-8"))
        if tuple(meta) != SOURCE_KEYS:
            raise ValueError(f"{src}: keys must be {SOURCE_KEYS}, got {tuple(meta)}")
        entry = {**meta, "problems_prefix": PROBLEMS_PREFIX,
                 "archives": {c: archive_url(meta["repository"], c)
                              for c in dict.fromkeys((meta["timing_commit"],
                                                      meta["problems_commit"]))}}
        if source_json(entry) != src.read_text(encoding="utf-8"):
            raise ValueError(f"{src}: not in the form the fetch writes (indent 2, newline)")
        files = {}
        for p in sorted(src.parent.rglob("*"), key=lambda p: p.as_posix()):
            if not p.is_file():
                continue
            rel = p.relative_to(src.parent).as_posix()
            if _origin(entry, rel) is None:
                raise ValueError(f"{p}: no known upstream origin (expected {TIMING_FILE}, "
                                 "source.json or level<N>/*.py)")
            files[f"{name}/{rel}"] = file_sha256(p)
        campaigns[name] = {**entry, "files": files}
    if not campaigns:
        raise ValueError(f"{root} has no <campaign>/source.json")
    first = campaigns[min(campaigns)]
    commit = first["timing_commit"]
    return {"license": {"repository": first["repository"], "commit": commit, "path": "LICENSE",
                        "url": archive_url(first["repository"], commit),
                        "sha256": file_sha256(root / "LICENSE")},
            "campaigns": campaigns}


def _find_commit(source: Path | None, commit: str, url: str, progress: bool):
    """``(label, archive or None, folder or None)`` holding the repository at ``commit``."""
    if source is None:
        return url, fetch.download(url, None, progress, OFFLINE_HINT), None
    if (source / commit).is_dir():
        folder = source / commit
        subs = [p for p in folder.iterdir() if not p.name.startswith(".")]
        # an unpacked GitHub archive: one top folder KernelBench-<commit>/
        if len(subs) == 1 and subs[0].is_dir() and subs[0].name.startswith(
                REPOSITORY.split("/")[1] + "-"):
            folder = subs[0]
        return str(folder), None, folder
    for suffix in ARCHIVE_SUFFIXES:
        if (source / (commit + suffix)).is_file():
            return str(source / (commit + suffix)), source / (commit + suffix), None
    raise FileNotFoundError(f"{source} has neither the files laid out like the data nor a "
                            f"{commit}/ folder or {commit}.tar.gz/.zip archive ({REPOSITORY} at "
                            f"commit {commit}); nothing was installed. {OFFLINE_HINT}")


def _plan(reg: dict, source: Path | None) -> tuple[dict, dict, dict]:
    """``(pins, origins, labels)``: ``pins`` {dest path: sha256}; ``origins`` {dest path:
    ("mirror", path) | ("generated", text) | (commit, upstream path)}; ``labels`` per
    campaign (and ``LICENSE``) where its files come from."""
    pins, origins, labels = {}, {}, {}
    lic = reg["license"]
    pins["LICENSE"] = lic["sha256"]
    if source is not None and (source / "LICENSE").is_file():
        origins["LICENSE"], labels["LICENSE"] = ("mirror", source / "LICENSE"), str(source)
    else:
        origins["LICENSE"] = (lic["commit"], lic["path"])
    for name, entry in reg["campaigns"].items():
        laid_out = source is not None and (source / name).is_dir()
        labels[name] = str(source / name) if laid_out else None
        for rel, digest in entry["files"].items():
            pins[rel] = digest
            commit, upstream = _origin(entry, rel[len(name) + 1:])
            if commit == "generated":
                origins[rel] = ("generated", source_json(entry))
            elif laid_out:
                origins[rel] = ("mirror", source / rel)
            else:
                origins[rel] = (commit, upstream)
    return pins, origins, labels


def _place_files(new: Path, scratch: Path, origins: dict, pins: dict, missing: dict) -> list:
    """Write each destination file from its origin (generated text, the mirror, or a commit's
    copy under ``scratch``) and check its pin; returns the problems found."""
    problems = []
    for rel, origin in origins.items():
        (new / rel).parent.mkdir(parents=True, exist_ok=True)
        if origin[0] == "generated":
            (new / rel).write_text(origin[1], encoding="utf-8")
        elif origin[0] == "mirror":
            if not origin[1].is_file():
                problems.append(f"{rel}: missing (no {origin[1]})")
                continue
            shutil.copyfile(origin[1], new / rel)
        else:
            commit, upstream = origin
            if f"{commit}:{upstream}" in missing:
                problems.append(f"{rel}: missing ({upstream} is not in "
                                f"{missing[f'{commit}:{upstream}']})")
                continue
            shutil.copyfile(scratch / "commits" / commit / upstream, new / rel)
        bad = pin_mismatch(new / rel, rel, pins[rel])
        if bad:
            problems.append(bad)
    return problems


def _assemble(new: Path, scratch: Path, source: Path | None, progress: bool) -> dict:
    reg = load_kernelbench_registry()
    sheets = load_datasheets(datasheets_path(), need_bf16=False)
    pins, origins, labels = _plan(reg, source)
    urls = {reg["license"]["commit"]: reg["license"]["url"]}
    for entry in reg["campaigns"].values():
        urls.update(entry["archives"])
    wanted: dict[str, dict] = {}  # commit -> {upstream path: None}
    for origin in origins.values():
        if origin[0] not in ("mirror", "generated"):
            wanted.setdefault(origin[0], {})[origin[1]] = None
    # every commit located (downloaded) before any is copied: a missing one fails fast
    found = {c: _find_commit(source, c, urls[c], progress) for c in wanted}
    missing: dict[str, str] = {}
    for commit, files in wanted.items():
        label, archive, folder = found[commit]
        out = scratch / "commits" / commit
        out.mkdir(parents=True)
        lost = (copy_from_archive(archive, files, out) if archive is not None
                else copy_from_folder(folder, files, out))
        for rel in lost:
            missing[f"{commit}:{rel}"] = label
    new.mkdir(parents=True)
    problems = _place_files(new, scratch, origins, pins, missing)
    if problems:
        raise ValueError(
            f"KernelBench data does not match the pins in {registry_path()} "
            f"{listed(problems, len(pins))}. Nothing was installed. Fetch "
            f"{REPOSITORY} at the pinned commits again, or point NSLIB_KERNELBENCH at a "
            "checked copy.")
    record = {"repository": REPOSITORY, "campaigns": {}, "license": {
        "commit": reg["license"]["commit"],
        "source": labels.get("LICENSE") or found[reg["license"]["commit"]][0]}}
    for name, entry in reg["campaigns"].items():
        record["campaigns"][name] = {
            "timing_commit": entry["timing_commit"], "problems_commit": entry["problems_commit"],
            "source": labels[name] or sorted({found[c][0] for c in
                                              (entry["timing_commit"], entry["problems_commit"])}),
            "files": len(entry["files"])}
    record["datasheets"] = {"source": datasheets_path().name,
                            "files": write_datasheets(new / "device_configs", sheets)}
    return record


def fetch_kernelbench(dest: str | os.PathLike | None = None,
                      source: str | os.PathLike | None = None, force: bool = False,
                      progress: bool = True) -> Path:
    """Install the KernelBench timings at ``dest`` (see :func:`kernelbench_dest`); return it.

    ``source``: None (download each pinned commit's GitHub archive through pooch, cached under
    ``$NSLIB_CACHE/downloads``) or a local folder: a copy laid out like the data
    (``<campaign>/`` folders, ``LICENSE``), or per commit a ``<commit>/`` clone (or unpacked
    archive) or a ``<commit>.tar.gz``/``.zip`` archive (the two forms may be mixed, per
    campaign). Every file is checked (``ValueError`` naming it, expected vs got); an existing
    ``dest`` raises ``FileExistsError`` unless ``force``. Writes ``<dest>.lock.json``.
    """
    dest = kernelbench_dest(dest)
    if (dest.exists() or dest.is_symlink()) and not force:
        raise FileExistsError(f"{dest} already exists; pass --force (force=True) to replace it")
    if source is not None:
        source = fetch.abs_path(source)
        if not source.is_dir():
            raise FileNotFoundError(f"Fetch source {source} is not a folder: --source with "
                                    f"--kernelbench takes a folder. {OFFLINE_HINT}")
    return build_and_install(dest, force,
                             lambda new, scratch: _assemble(new, scratch, source, progress))
