"""FP32 kernels of the NeuSight classes over the sampled dims of ``data/dataset/dims/``.

The plan takes each class's test dims first, then its training dims, each shuffled with the
seed, and interleaves the classes so any budget covers all of them. Vector rows take the
elementwise ops in turn. Shapes follow :mod:`nslib.kernels.sizes`: ``bmm`` multiplies B
``M x N`` matrices by ``N x K`` ones, ``linear`` is ``F.linear`` of an ``M x N`` input with a
``K x N`` weight, vector ops act on ``B x H`` (softmax and layer norm along ``H``). TF32 is off,
as in the NeuSight measurements (PyTorch's default for FP32 products).
"""
from __future__ import annotations

import itertools
from functools import partial

import numpy as np
import pandas as pd

from nslib.data.paths import data_root, require
from nslib.evaluation.collect import layout
from nslib.evaluation.collect.sweep import reps_for, rough_s, unmeasured
from nslib.evaluation.collect.timing import launches, main_launch, time_calls
from nslib.kernels import sizes

# class -> (test dims file, training dims file, dims)
DIMS = {"linear": ("test_linear", "train_linear", ["B", "M", "N", "K"]),
        "bmm": ("test_bmm", "train_bmm", ["B", "M", "N", "K"]),
        "elementwise": ("test_vec", "train_vec", ["B", "H"]),
        "softmax": ("test_vec", "train_vec", ["B", "H"]),
        "layernorm": ("test_vec", "train_ln", ["B", "H"])}
ELEMENTWISE = [op for op, (c, _, _) in sizes.OPS.items() if c == "elementwise"]
OP_OF = {"linear": "linear", "bmm": "bmm", "softmax": "softmax", "layernorm": "ln"}


def _dims(data, name: str, cols: list[str]) -> pd.DataFrame:
    path = require(data_root(data) / "data" / "dataset" / "dims" / f"{name}.csv",
                   "sampled kernel dims")
    frame = pd.read_csv(path, sep=";", header=None)
    return frame.iloc[:, :len(cols)].set_axis(cols, axis=1).astype(int)


def plan(data=None, seed: int = 0, classes=tuple(DIMS)) -> list[dict]:
    """Items ``{cls, op, dims..., large}`` in measuring order (see module doc); ``large`` marks
    the test dims, as the NeuSight test CSVs do."""
    rng = np.random.default_rng(seed)
    queues = []
    for cls in classes:
        test, train, cols = DIMS[cls]
        items = []
        for name, large in ((test, True), (train, False)):
            records = _dims(data, name, cols).to_dict("records")
            for i in rng.permutation(len(records)):
                items.append({"cls": cls, **records[i], "large": large})
        if cls == "elementwise":
            for item, op in zip(items, itertools.cycle(ELEMENTWISE)):
                item["op"] = op
        else:
            for item in items:
                item["op"] = OP_OF[cls]
        queues.append(items)
    out = [x for group in itertools.zip_longest(*queues) for x in group if x is not None]
    return out


def _cost(item: dict) -> tuple[float, float, float]:
    """(FLOPs, bytes, bytes of tensors held) of one item, FP32."""
    if item["cls"] in sizes.GEMM_CLASSES:
        B, M, N, K = (float(item[c]) for c in "BMNK")
        held = 4 * B * (M * N + N * K + M * K)
        return 2 * B * M * N * K, held, held
    n = float(item["B"]) * float(item["H"])
    n_in = sizes.OPS[item["op"]][1]
    return 6 * n, 4 * n * (n_in + 1), 4 * n * (n_in + 1)


def _call(item: dict, device: str):
    """The call that runs one item's kernel on fresh random tensors."""
    import torch
    import torch.nn.functional as F

    r = partial(torch.randn, device=device)
    op = item["op"]
    if op == "bmm":
        a, b = r(item["B"], item["M"], item["N"]), r(item["B"], item["N"], item["K"])
        return lambda: torch.bmm(a, b)
    if op == "linear":
        x, w = r(item["M"], item["N"]), r(item["K"], item["N"])
        return lambda: F.linear(x, w)
    x = r(item["B"], item["H"])
    if op == "softmax":
        return lambda: torch.softmax(x, dim=-1)
    if op == "ln":
        w, b = r(item["H"]), r(item["H"])
        return lambda: F.layer_norm(x, (item["H"],), w, b)
    y = r(item["B"], item["H"]).abs() + 1.0  # a safe divisor and exponent
    unary = {"addu": lambda: x + 1.5, "mulu": lambda: x * 1.5, "divu": lambda: x / 1.5,
             "powu": lambda: torch.pow(x, 2.0), "tanh": lambda: torch.tanh(x),
             "relu": lambda: torch.relu(x), "gelu": lambda: F.gelu(x)}
    binary = {"add": lambda: x + y, "mul": lambda: x * y, "div": lambda: x / y,
              "pow": lambda: torch.pow(x.abs(), y)}
    return {**unary, **binary}[op]


def measurer(clock, rates: dict, versions: dict, mem_cap: float):
    """``measure(item)`` for :func:`nslib.evaluation.collect.sweep.run_plan`: the rough time,
    and a thunk that times the item and returns its NeuSight CSV row."""
    def measure(item):
        flops, nbytes, held = _cost(item)
        rough = rough_s(flops, nbytes, rates)
        if held > mem_cap:
            return float("inf"), None

        def thunk():
            fn = _call(item, clock.device)
            ms = float(np.median(time_calls(fn, clock, reps_for(rough))))
            found = launches(fn, clock)
            main = main_launch(found)
            dims = ({c: item[c] for c in "BMNK"} if item["cls"] in sizes.GEMM_CLASSES
                    else {"B": item["B"], "H": item["H"], "large": item["large"]})
            return {"OPName": item["op"], "Latency": ms, **versions, "Kernel Name": main.name,
                    "Warps per SM": main.warps_per_sm, "Blocks per SM": main.blocks_per_sm,
                    "Grid x": main.grid[0], "Grid y": main.grid[1], "Grid z": main.grid[2],
                    "Block x": main.block[0], "Block y": main.block[1],
                    "Block z": main.block[2], "Kernels": "".join(";" + x.name for x in found),
                    "cls": item["cls"], **dims}
        return rough, thunk
    return measure


def writer(out):
    """``write(rows)``: each row to its class's test CSV (NeuSight's columns, in order)."""
    targets = {cls: (layout.kernel_csv(out, cls), layout.GEMM_COLUMNS
                     if cls in sizes.GEMM_CLASSES else layout.VEC_COLUMNS) for cls in DIMS}
    return lambda rows: layout.append_split(rows, "cls", targets)


def key_of(item: dict) -> tuple:
    """The identity of an item in a written CSV: op name and dims, as strings."""
    dims = "BMNK" if item["cls"] in sizes.GEMM_CLASSES else "BH"
    return (item["op"], *(str(int(item[c])) for c in dims))


def pending(items: list[dict], out) -> list[dict]:
    """The items of ``items`` not yet in the output's CSVs (a rerun resumes)."""
    done = set()
    for cls in DIMS:
        dims = ["B", "M", "N", "K"] if cls in sizes.GEMM_CLASSES else ["B", "H"]
        done |= layout.done_keys(layout.kernel_csv(out, cls), ["OPName", *dims])
    return unmeasured(items, key_of, done)
