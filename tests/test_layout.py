"""The package's shape, read from its source: dependencies point one way through the pipeline's
stages, no module imports another's private names, and functions and modules stay short."""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "nslib"
# the pipeline's stages in order; a module may import from its own stage or an earlier one
STAGES = ["data", "viz", "kernels", "predictors", "model", "evaluation", "explore", "reproduce",
          "cli"]
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


MODULES = _modules()


def _imports(name: str, path: Path):
    """``(line, imported module, imported names)`` for every nslib import, wherever it sits."""
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "nslib":
                    yield node.lineno, a.name, []
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                mod = ".".join(base[:len(base) - node.level + 1] + ([mod] if mod else []))
            if mod.split(".")[0] != "nslib":
                continue
            names = [a.name for a in node.names]
            subs = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in MODULES]
            yield node.lineno, mod, [n for n in names if f"{mod}.{n}" not in MODULES]
            for s in subs:
                yield node.lineno, s, []


def _graph() -> dict[str, set[str]]:
    return {m: {t for _, t, _ in _imports(m, p) if t != m} for m, p in MODULES.items()}


def _stage(module: str) -> int:
    parts = module.split(".")
    return STAGES.index(parts[1]) if len(parts) > 1 and parts[1] in STAGES else -1


def test_no_import_cycle():
    graph, state, stack = _graph(), {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == "open":
                cycle = stack[stack.index(t):] + [t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_dependencies_follow_the_pipeline():
    bad = [f"{m} imports {t}" for m, ts in _graph().items() for t in ts
           if _stage(t) > _stage(m) and not t.startswith(m + ".")]
    assert not bad, "imports against the pipeline (" + " -> ".join(STAGES) + "): " + \
        "; ".join(sorted(bad))


def test_no_private_name_crosses_modules():
    bad = [f"{m}:{line} imports {n} from {t}" for m, p in MODULES.items()
           for line, t, names in _imports(m, p) if t != m
           for n in names if n.startswith("_") and not n.startswith("__")]
    assert not bad, "; ".join(bad)


def test_functions_and_modules_are_short():
    long_fns, long_mods = [], []
    for m, p in MODULES.items():
        src = p.read_text()
        if src.count("\n") > MAX_MODULE_LINES:
            long_mods.append(f"{m} ({src.count(chr(10))} lines)")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_fns.append(f"{m}.{node.name} ({n} lines)")
    assert not long_mods, f"modules over {MAX_MODULE_LINES} lines: {', '.join(long_mods)}"
    assert not long_fns, f"functions over {MAX_FUNCTION_LINES} lines: {', '.join(long_fns)}"
