"""The package's shape, read from its source (:mod:`nslib.viz.layout`): dependencies point one
way through the pipeline's stages, no module imports another's private names, and functions
and modules stay short."""
import ast

import pytest

from nslib.data.sources import import_graph, imports, modules
from nslib.viz.layout import STAGES, stage, stage_edges

MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 400
GRAPH = import_graph()


def test_the_parser_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "nslib"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "__init__.py").write_text("")
    (pkg / "data" / "a.py").write_text("from nslib.data import b\n")
    (pkg / "data" / "b.py").write_text("def f():\n    from .a import _x\n    import nslib.data\n")
    known = modules(pkg)
    assert set(known) == {"nslib", "nslib.data", "nslib.data.a", "nslib.data.b"}
    got = list(imports("nslib.data.b", known["nslib.data.b"], known))
    assert got == [(2, "nslib.data.a", ["_x"]), (3, "nslib.data", [])]
    assert import_graph(pkg)["nslib.data.a"] == {"nslib.data", "nslib.data.b"}


def test_no_import_cycle():
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(GRAPH.get(m, ())):
            if state.get(t) == "open":
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)


def test_every_module_sits_in_a_stage():
    assert {stage(m) for m in GRAPH if m != "nslib"} == set(STAGES)


def test_dependencies_follow_the_pipeline():
    back = [(a, b) for a, b in stage_edges(GRAPH) if STAGES.index(b) > STAGES.index(a)]
    bad = [f"{m} imports {t}" for m, ts in GRAPH.items() for t in ts
           if (stage(m), stage(t)) in back]
    assert not bad, f"imports against the pipeline ({' -> '.join(STAGES)}): {'; '.join(bad)}"


def test_no_private_name_crosses_modules():
    known = modules()
    bad = [f"{m}:{line} imports {n} from {t}" for m, p in known.items()
           for line, t, names in imports(m, p, known) if t != m
           for n in names if n.startswith("_") and not n.startswith("__")]
    assert not bad, "; ".join(bad)


def test_functions_and_modules_are_short():
    long_fns, long_mods = [], []
    for m, p in modules().items():
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


def test_the_layout_picture_draws(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from nslib.viz.layout import draw
    fig = draw()
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert all(s in texts for s in STAGES)
