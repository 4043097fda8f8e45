"""The package's own code as a graph, read from the source: which modules import which, and
the files a result computed by some modules can depend on (:func:`dependencies`), and a digest
of what they compute (:func:`code_digest`): every cache key hashes it, so an edit of that code,
and only of its code (not of its prose), invalidates the result.

Imports are read with :mod:`ast` (nothing is imported), wherever they sit in a module. The
stages drawn from this graph, and the test of their order, are :mod:`nslib.viz.layout`'s.
"""
from __future__ import annotations

import ast
import hashlib
import os
from functools import lru_cache
from pathlib import Path

from nslib.data.paths import StatMemo

PACKAGE = Path(__file__).resolve().parents[1]


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """``{dotted module name: file}`` of every module of the package (packages by __init__)."""
    out = {}
    for f in sorted(package.rglob("*.py")):
        parts = f.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def imports(name: str, path: Path, known: dict[str, Path]):
    """``(line, imported module, [names imported from it])`` for each import of the package in
    module ``name``; ``from pkg import sub`` of a submodule yields the submodule itself."""
    root = name.split(".")[0]
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == root:
                    yield node.lineno, a.name, []
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                mod = ".".join(base[:len(base) - node.level + 1] + ([mod] if mod else []))
            if mod.split(".")[0] != root:
                continue
            names = [a.name for a in node.names]
            yield node.lineno, mod, [n for n in names if f"{mod}.{n}" not in known]
            for n in names:
                if f"{mod}.{n}" in known:
                    yield node.lineno, f"{mod}.{n}", []


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """``{module: {modules it imports}}`` within the package."""
    known = modules(package)
    return {m: {t for _, t, _ in imports(m, p, known) if t != m} for m, p in known.items()}


@lru_cache(maxsize=1)
def _known() -> dict[str, Path]:
    return modules()


@lru_cache(maxsize=1)
def _imports_memo() -> StatMemo:
    """The parsed imports of each module file, for this set of package modules (a module
    added elsewhere can turn ``from pkg import name`` into an import of that module)."""
    names = hashlib.sha256(" ".join(sorted(_known())).encode()).hexdigest()[:12]
    return StatMemo(f"imports-{names}")


_CODE_DIGESTS = StatMemo("code-sha256")


@lru_cache(maxsize=None)
def _imported(name: str) -> frozenset[str]:
    """The package modules ``name`` imports (its file parsed once while it is unchanged,
    :class:`nslib.data.paths.StatMemo`)."""
    known = _known()
    return frozenset(_imports_memo().get(known[name], lambda: sorted(
        {t for _, t, _ in imports(name, known[name], known) if t != name})))


def dependencies(*names: str) -> list[Path]:
    """The files of modules ``names`` (dotted) and of every package module they import,
    transitively, sorted: the code a result computed by them can depend on (cache keys hash
    it, so an edit anywhere in it, and only there, invalidates the result). Only the modules
    reached are parsed: a cached prediction's start-up pays for its predictor's code alone."""
    files = _known()
    todo, seen = list(names), set()
    while todo:
        m = todo.pop()
        if m in seen or m not in files:
            continue
        seen.add(m)
        todo.extend(_imported(m))
    return sorted(files[m] for m in seen)


def _without_docstrings(tree: ast.AST) -> ast.AST:
    """``tree`` with the docstring of the module and of every class and function removed."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                    isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


@lru_cache(maxsize=None)
def _module_digest(path: str, size: int, mtime_ns: int) -> bytes:
    """SHA-256 of one module's syntax tree without docstrings (line numbers, comments and
    layout are not in the tree); the file's size and time stamp only key the memo (kept
    across processes, :class:`nslib.data.paths.StatMemo`: parsing every module a predictor
    imports was a fifth of a cached ``nslib predict``)."""
    def digest() -> str:
        tree = _without_docstrings(ast.parse(Path(path).read_text()))
        return hashlib.sha256(ast.dump(tree).encode()).hexdigest()
    return bytes.fromhex(_CODE_DIGESTS.get(path, digest))


def code_digest(files) -> str:
    """SHA-256 (hex, first 16 chars) of what the Python ``files`` compute, in order: each
    module's name and syntax tree without comments, docstrings or layout. A cache keyed on it
    survives an edit of the prose (a docstring, a comment, a line break) and nothing else."""
    h = hashlib.sha256()
    for f in files:
        st = os.stat(f)
        h.update(Path(f).name.encode())
        h.update(_module_digest(os.path.abspath(f), st.st_size, st.st_mtime_ns))
    return h.hexdigest()[:16]
