"""Will the step fit? The peak memory of a scenario's step on each GPU, and its warnings."""
from __future__ import annotations

import pandas as pd

from nslib.data.gpus import GPU
from nslib.data.settings import Settings
from nslib.model.memory import memory_of
from nslib.model.step import Step

# parts of the peak memory, in the order the memory bar stacks them
MEMORY_PARTS = ("weights", "grads", "optimizer", "activations", "kv_cache", "framework", "comm")


def memory_table(specs: list[GPU], labels: list[str], model, step: Step, *,
                 optimizer: str = "adam", settings: Settings | None = None) -> pd.DataFrame:
    """Peak memory of ``step`` (a :class:`nslib.model.step.Step`) on each GPU
    (:func:`nslib.model.memory.memory_of`), GB: one row per GPU label with the breakdown,
    ``total``, ``capacity`` and ``fits``."""
    rows = []
    for spec, label in zip(specs, labels):
        d = memory_of(spec, model, step, optimizer=optimizer, settings=settings).to_dict()
        rows.append({"gpu": label, **{k: d[k] for k in MEMORY_PARTS},
                     "total": d["total"], "capacity": d["capacity"], "fits": d["fits"]})
    return pd.DataFrame(rows).set_index("gpu")


def memory_warnings(mem: pd.DataFrame) -> list[str]:
    """One 'does not fit (needs X GB of Y)' message per GPU the step does not fit on."""
    out = []
    for label, r in mem[~mem["fits"]].iterrows():
        big = max(MEMORY_PARTS, key=lambda k: r[k])
        out.append(f"{label}: does not fit (needs {r['total']:.1f} GB of {r['capacity']:g}; "
                   f"largest part: {big} {r[big]:.1f} GB): its time is what the step would "
                   f"take with enough memory, and is not shown.")
    return out


__all__ = ["MEMORY_PARTS", "memory_table", "memory_warnings"]
