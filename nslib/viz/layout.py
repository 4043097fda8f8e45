"""How the code is laid out, read from the source: the pipeline's stages (nslib's subpackages),
which modules import which, and a picture of it for the README (``figures/layout.png``).

    python -m nslib.viz.layout          # redraws figures/layout.png and .pdf

Imports are read with :mod:`ast` (nothing is imported), wherever they sit in a module.
``tests/test_layout.py`` checks the same graph: no cycle, stages in order, no private import.
"""
from __future__ import annotations

import ast
from collections import Counter
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
# the stages in pipeline order; a module may import from its own stage or an earlier one
STAGES = ("data", "viz", "kernels", "predictors", "model", "evaluation", "explore",
          "reproduce", "cli")


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


@lru_cache(maxsize=None)
def _imported(name: str) -> frozenset[str]:
    """The package modules ``name`` imports (its file is parsed once per process)."""
    known = _known()
    return frozenset(t for _, t, _ in imports(name, known[name], known) if t != name)


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


def stage(module: str) -> str | None:
    """The stage a dotted module name belongs to (None for the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else None


def stage_edges(graph: dict[str, set[str]]) -> Counter:
    """``{(importing stage, imported stage): number of module imports}`` across stages."""
    return Counter((stage(m), stage(t)) for m, ts in graph.items() for t in ts
                   if stage(m) and stage(t) and stage(m) != stage(t))


def draw(package: Path = PACKAGE):
    """The stages as boxes in pipeline order, each listing its modules, with an arrow from a
    stage to every earlier stage it imports (width: number of imports). Returns the figure."""
    import matplotlib.pyplot as plt
    graph = import_graph(package)
    members = {s: sorted(m.split(".", 2)[-1] for m in graph if stage(m) == s and
                         m != f"nslib.{s}") for s in STAGES}
    fig, ax = plt.subplots(figsize=(15, 6.5))
    xs = {s: i * 1.7 for i, s in enumerate(STAGES)}
    for s in STAGES:
        text = s + "/" if members[s] else s + ".py"
        body = "\n".join(members[s][:30]) + ("\n..." if len(members[s]) > 30 else "")
        ax.text(xs[s], 0.0, f"{text}\n\n{body}".rstrip(), ha="center", va="top", fontsize=7.5,
                family="monospace", bbox={"boxstyle": "round", "fc": "#eef3fb", "ec": "#4a6fa5"})
    for (a, b), n in stage_edges(graph).items():
        ax.annotate("", xy=(xs[b], 0.25), xytext=(xs[a], 0.25),
                    arrowprops={"arrowstyle": "-|>", "color": "#4a6fa5", "alpha": 0.5,
                                "lw": 0.5 + 0.12 * min(n, 20), "shrinkA": 2, "shrinkB": 2,
                                "connectionstyle": "arc3,rad=0.28"})
    ax.set_xlim(-0.9, xs[STAGES[-1]] + 0.9)
    ax.set_ylim(-2.3, 2.4)
    ax.axis("off")
    ax.set_title("nslib: stages in pipeline order; arrows point at what a stage imports "
                 "(always an earlier stage)", fontsize=10)
    return fig


if __name__ == "__main__":
    from nslib.viz.figures import save_figure
    for p in save_figure(draw(), "layout"):
        print(p)
