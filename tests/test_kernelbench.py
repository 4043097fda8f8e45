"""KernelBench as a kernel test set (nslib.data.kernelbench, nslib.evaluation.kernelbench) and
the module tracer behind it (nslib.model.module_trace), on a fake campaign made here; the
shared copy when there is one."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from kernelbench_fixture import fake_root

from nslib.data import kernelbench as kb
from nslib.data.paths import DataNotFoundError
from nslib.data.settings import Settings
from nslib.evaluation import kernelbench as ev
from nslib.kernels import sizes
from nslib.model.module_trace import ProblemError, problem_trace


def _problem(forward: str, inputs: str, init: str = "[]", ctor: str = "") -> str:
    """A KernelBench-style problem file: ``Model`` with ``forward`` (its body, one line),
    ``get_inputs()`` returning ``inputs`` and ``get_init_inputs()`` returning ``init``."""
    init_fn = (f"    def __init__(self, c):\n        super().__init__()\n        {ctor}\n"
               if ctor else "")
    return (f"import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n{init_fn}"
            f"    def forward(self, *xs):\n        return {forward}\n\n"
            f"def get_inputs():\n    return {inputs}\n\n"
            f"def get_init_inputs():\n    return {init}\n")


PROBLEMS = {
    "1_Matmul.py": _problem("torch.matmul(*xs)", "[torch.randn(256, 512), torch.randn(512, 128)]"),
    "2_ReLU.py": _problem("torch.relu(xs[0])", "[torch.randn(16, 4096)]"),
    "3_Conv.py": _problem("self.conv(xs[0])", "[torch.randn(2, 3, 32, 32)]", init="[3]",
                          ctor="self.conv = nn.Conv2d(c, 8, 3)"),
    "4_Swish.py": _problem("xs[0] * torch.sigmoid(xs[0])", "[torch.randn(16, 4096)]"),
    "5_DataDependent.py": _problem("xs[0][: int(xs[0].sum().item())]",
                                   "[torch.randn(16, 4096)]"),
    "6_Matvec.py": _problem("torch.matmul(*xs)",
                            "[torch.randn(256, 65536), torch.randn(65536, 1)]"),
}
# measured ms: the matmul at 1.1x its roofline + 20 us, the relu at its roofline + 10 us (the
# harness bound is then 10 us), the rest anything
TIMES = {"1_Matmul.py": 0.0, "2_ReLU.py": 0.0, "3_Conv.py": 0.5, "4_Swish.py": 0.05,
         "5_DataDependent.py": 0.05, "6_Matvec.py": 0.0}


def _roof(cls, op, dims) -> float:
    frame = pd.DataFrame([{"cls": cls, "op": op, **dims, **{"num_sm": 10.0,
                           "peak_gflops": 20000.0, "mem_bw": 1000.0}}])
    return float(sizes.roofline_ms(frame)[0])


@pytest.fixture
def fake(tmp_path):
    root, camp = fake_root(tmp_path)
    (camp / "level1").mkdir(parents=True)
    for name, text in PROBLEMS.items():
        (camp / "level1" / name).write_text(text)
    nan = float("nan")
    times = dict(TIMES)
    times["1_Matmul.py"] = 1.1 * _roof("linear", "linear", dict(B=1, M=256, N=512, K=128,
                                                                H=nan)) + 0.02
    times["2_ReLU.py"] = _roof("elementwise", "relu", dict(B=16, H=4096, M=nan, N=nan,
                                                          K=nan)) + 0.01
    times["6_Matvec.py"] = _roof("linear", "linear", dict(B=1, M=256, N=65536, K=1, H=nan)) \
        + 0.03
    entries = {k: {"mean": v, "std": 0.0, "min": v, "max": v, "num_trials": 100,
                   "hardware": "Fake GPU 9", "device": "cuda:0"} for k, v in times.items()}
    entries["7_Missing.py"] = {"mean": 1.0, "hardware": "Fake GPU 9"}
    entries["8_Unknown_GPU.py"] = {"mean": 1.0, "hardware": "Some Other GPU"}
    (camp / kb.TIMING_FILE).write_text(json.dumps({"level1": entries}))
    return root


def test_problem_trace_by_hand(fake):
    tr = problem_trace(fake / "Fake_campaign" / "level1" / "1_Matmul.py")
    assert tr[["cls", "op", "B", "M", "N", "K"]].values.tolist() == \
        [["linear", "linear", 1.0, 256.0, 512.0, 128.0]]
    swish = problem_trace(fake / "Fake_campaign" / "level1" / "4_Swish.py")
    assert swish["op"].tolist() == ["tanh", "mul"] and (swish["B"] * swish["H"] == 16 * 4096).all()
    with pytest.raises(ProblemError, match="meta device"):
        problem_trace(fake / "Fake_campaign" / "level1" / "5_DataDependent.py")


def test_problem_rows_and_skips(fake):
    rows, skipped = ev.problem_rows(fake, progress=False)
    assert rows["problem"].tolist() == ["1_Matmul.py", "2_ReLU.py", "6_Matvec.py"]
    assert rows["family"].tolist() == ["GEMM", "elementwise", "matrix-vector"]
    assert (rows["gpu"] == "Fake GPU 9").all() and (rows["num_sm"] == 10).all()
    why = dict(zip(skipped["problem"], skipped["reason"]))
    assert why == {"3_Conv.py": "convolution", "4_Swish.py": "2 kernels",
                   "5_DataDependent.py": "cannot trace", "7_Missing.py": "problem file missing",
                   "8_Unknown_GPU.py": "no datasheet with Device 'Some Other GPU'"}


def test_harness_bound_and_table(fake):
    rows, _ = ev.problem_rows(fake, progress=False)
    h = ev.harness_ms(rows)
    assert h["Fake_campaign"] == pytest.approx(0.01)   # the relu's slack is the smallest
    roof = sizes.roofline_ms(rows) + 0.01
    tab = ev.error_table(rows, roof)
    want_relu = 0.0
    assert tab.loc["elementwise", "Fake GPU 9"] == pytest.approx(want_relu, abs=1e-9)
    lin = rows[rows["cls"] == "linear"]
    want = np.mean(100 * np.abs(roof[lin.index] - lin["latency_ms"]) / lin["latency_ms"])
    assert tab.loc["linear", "Fake GPU 9"] == pytest.approx(want)
    assert "matrix-vector" in tab.index and ev.MEAN in tab.columns
    assert ev.table_json(tab)["elementwise"] == {"Fake GPU 9": 0.0}
    # per class, the least slack of the class's problems (the matmul and the matvec: linear)
    slack = rows["latency_ms"] - sizes.roofline_ms(rows)
    by_class = ev.class_harness_ms(rows)["Fake_campaign"]
    assert by_class == pytest.approx({"elementwise": 0.01,
                                      "linear": slack[rows["cls"] == "linear"].min()})


def test_bad_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("NSLIB_KERNELBENCH", str(tmp_path / "nothing"))
    with pytest.raises(DataNotFoundError, match="fetch --kernelbench"):
        kb.kernelbench_root()
    (tmp_path / "k" / "device_configs").mkdir(parents=True)
    (tmp_path / "k" / "c").mkdir()
    (tmp_path / "k" / "c" / kb.TIMING_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="not a KernelBench timing file"):
        kb.timings(tmp_path / "k")
    with pytest.raises(ValueError, match="level must be"):
        kb.timings(tmp_path / "k", level=7)


def test_family_rules():
    f = pd.DataFrame({"cls": ["linear", "linear", "linear", "softmax"],
                      "B": [1, 1, 1, 4], "M": [256, 256, 4096, np.nan],
                      "N": [131072, 131072, 4096, np.nan], "K": [1, 256, 4096, np.nan]})
    assert ev.family(f).tolist() == ["matrix-vector", "long reduction", "GEMM", "softmax"]


def test_evaluate_with_the_data(fake, data_dir):
    res = ev.evaluate(["roofline"], root=fake, settings=Settings(progress=False))
    frame = res["frame"]
    # the roofline's GPU time (never under the launch gap) plus the harness bound
    from nslib.model.stream import LAUNCH_US
    relu = frame[frame["problem"] == "2_ReLU.py"]
    roof = sizes.roofline_ms(relu)[0]
    assert relu["pred_roofline"].iloc[0] == pytest.approx(max(roof, LAUNCH_US / 1e3) + 0.01)
    out = subprocess.run([sys.executable, "-m", "nslib.cli", "eval-kernels", "--predictor",
                          "roofline", "--kernelbench", str(fake), "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert set(json.loads(out.stdout)) >= {"linear", "elementwise", "matrix-vector"}
    bad = subprocess.run([sys.executable, "-m", "nslib.cli", "eval-kernels", "--kernelbench",
                          str(fake), "--logo"], capture_output=True, text=True)
    assert bad.returncode == 2 and "drop --dtype, --logo" in bad.stderr


def test_shared_campaigns_flow(kernelbench_dir):
    rows, skipped = ev.problem_rows(kernelbench_dir, progress=False)
    assert len(rows) + len(skipped) == len(kb.timings(kernelbench_dir))
    assert set(rows["cls"]) == set(sizes.CLASSES)
    assert set(rows["gpu"]) <= set(kb.datasheets(kernelbench_dir))
    assert {"matrix-vector", "long reduction"} <= set(rows["family"])


def test_timing_entries_are_validated(tmp_path):
    root = tmp_path / "k"
    (root / "device_configs").mkdir(parents=True)
    (root / "c").mkdir()
    good = {"mean": 1.0, "std": None, "hardware": "Fake GPU 9"}
    (root / "c" / kb.TIMING_FILE).write_text(json.dumps({"level1": {"1_A.py": good}}))
    assert np.isnan(kb.timings(root)["std_ms"].iat[0])
    for name, entry in (("../1_A.py", good), ("1_A.py", {**good, "mean": True}),
                        ("1_A.py", {**good, "mean": -1.0})):
        (root / "c" / kb.TIMING_FILE).write_text(json.dumps({"level1": {name: entry}}))
        with pytest.raises(ValueError, match="problem file name|positive 'mean'"):
            kb.timings(root)


def test_floor_of_the_class_the_predictor_priced(data_dir):
    from nslib.model.stream import floors

    class Flat:
        """Prices everything at 50 us; ``priced`` says how it sees a GEMM."""
        def __init__(self, priced):
            self.priced = priced

        def predict(self, frame):
            return np.full(len(frame), 0.05)

        def priced_frame(self, frame):
            return frame.assign(cls=self.priced)

    gpu = {"num_sm": 80.0, "peak_gflops": 14000.0, "mem_bw": 900.0, "mem_gb": 32.0,
           "l2_mb": 6.0}
    row = pd.DataFrame([{"cls": "linear", "op": "linear", "B": 1.0, "M": 256.0, "N": 4096.0,
                         "K": 1.0, "H": np.nan, **gpu}])
    as_gemm, as_stream = floors(Flat("linear"), row)[0], floors(Flat("elementwise"), row)[0]
    assert as_stream == pytest.approx(0.05)   # the elementwise floor, ratio 1
    assert as_gemm > as_stream                # linear's dispatch costs the host more
