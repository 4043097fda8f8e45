"""How the code is laid out: the pipeline's stages (nslib's subpackages) over the import graph
of :mod:`nslib.data.sources`, and a picture of it for the README (``figures/layout.png``).

    python -m nslib.viz.layout          # redraws figures/layout.png and .pdf

``tests/test_layout.py`` checks the same graph: no cycle, stages in order, no private import.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from nslib.data.sources import PACKAGE, import_graph

# the stages in pipeline order; a module may import from its own stage or an earlier one.
# viz draws what evaluation computes, so it comes after it (it reads only data's paths)
STAGES = ("data", "kernels", "predictors", "model", "evaluation", "viz", "explore",
          "reproduce", "cli")


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
