"""The paper's method priced on the original tool's own operator graphs
(nslib.evaluation.original_graph): kernel rows by hand, the layer repeated, the plain sum."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nslib.data.gpus import gpu_from_dict
from nslib.evaluation.original_graph import graph_kernels, graph_ms, kernel_row

GPU = gpu_from_dict({"Device": "Test GPU", "Dev_Mem": 32, "Mem_Bw": 1000, "Num_Sm": 80,
                     "Core_Per_SM": 64, "Freq": 1500, "SingleFLOPs": 15000, "L2Cache": 6})


def test_kernel_rows_by_hand():
    lin = kernel_row("Linear", (1024, 1280, 3840))   # a 1024 x 1280 input, 1280 x 3840 weight
    assert (lin["cls"], lin["B"], lin["M"], lin["N"], lin["K"]) == ("linear", 1, 1024, 1280, 3840)
    bmm = kernel_row("BMM", (20, 1024, 64, 1024))
    assert (bmm["cls"], bmm["B"], bmm["M"], bmm["N"], bmm["K"]) == ("bmm", 20, 1024, 64, 1024)
    ln = kernel_row("VECln", (1024, 1280))
    assert (ln["cls"], ln["op"], ln["B"], ln["H"]) == ("layernorm", "ln", 1024, 1280)
    mul = kernel_row("VECmulu", [1, 4096])
    assert (mul["cls"], mul["op"], mul["B"], mul["H"]) == ("elementwise", "mulu", 1, 4096)
    mem = kernel_row("MEM", ((2, 3), (2, 3)))       # read 6 elements, write 6: 48 bytes
    assert mem["cls"] == "memory" and mem["bytes"] == 48.0
    with pytest.raises(ValueError, match="multi-GPU"):
        kernel_row("ALLREDUCE", ((4,),))
    with pytest.raises(ValueError, match="unknown original op kind"):
        kernel_row("VECbessel", (1, 2))


def _graph(root):
    folder = root / "scripts" / "asplos"
    (folder / "data" / "device_configs").mkdir(parents=True)
    (folder / "results" / "opgraph").mkdir(parents=True)
    rows = [("embed", "EMBEDDING", [["MEM", ((4, 8), (4, 8))]], [], []),
            ("transformer_h_0_ln_1", "VECln", [["VECln", (4, 8)]], [["VECmul", (4, 8)]],
             [["VECadd", [1, 8]], ["VECadd", [1, 8]]]),
            ("addmm", "Linear", [["Linear", (4, 8, 8)]],
             [["Linear", (4, 8, 8)], ["Linear", (8, 4, 8)]], [["VECadd", [1, 64]]]),
            ("transformer_ln_f", "VECln", [["VECln", (4, 8)]], [["VECmul", (4, 8)]], [])]
    pd.DataFrame([{"Name": n, "OpName": o, "FwOps": repr(f), "BwOps": repr(b),
                   "AccOps": repr(a)} for n, o, f, b, a in rows]) \
        .to_csv(folder / "results" / "opgraph" / "tiny-train-4-1.csv", index=False)
    return root


class Flat:
    """Every kernel 1 ms; memory operators priced as the plain sum prices them alone."""

    name, plain_sum = "flat", False

    def predict(self, frame):
        return np.ones(len(frame))


def test_layer_repeats_and_phases(tmp_path):
    root = _graph(tmp_path)
    inf = graph_kernels("tiny-train-4-1", 3, False, root)
    # forward: the embedding copy once, the layer's norm and GEMM 3 times, the final norm once
    assert inf["count"].tolist() == [1, 3, 3, 1] and set(inf["phase"]) == {"fw"}
    assert inf.loc[0, "bytes"] == 4 * 64                 # a 4 x 8 read and a 4 x 8 write
    train = graph_kernels("tiny-train-4-1", 3, True, root)
    by = train.groupby("phase")["count"].sum()
    # backward: the layer's mul and two GEMMs x 3, the final mul; accumulation: 3 adds x 3
    assert (by["fw"], by["bw"], by["acc"]) == (8, 10, 9)
    # one kernel, 1 ms, as many times as it runs: the plain sum
    assert graph_ms(Flat(), "tiny-train-4-1", GPU, 3, True, root) == pytest.approx(27.0)
    assert graph_ms(Flat(), "tiny-train-4-1", GPU, 1, False, root) == pytest.approx(4.0)


def test_a_shipped_graph(data_dir):
    # GPT-2 large (36 layers): 4 linear layers a block and the head; training adds both
    # gradients of each (the original tool's backward), and a layer norm's input gradient is
    # one elementwise mul
    g = graph_kernels("gpt2_large-train-1024-1", 36, True)
    n = g.groupby(["phase", "cls"])["count"].sum()
    assert n[("fw", "linear")] == 4 * 36 + 1 and n[("bw", "linear")] == 2 * (4 * 36 + 1)
    assert n[("fw", "layernorm")] == 2 * 36 + 1 and ("bw", "layernorm") not in n.index
