"""cuDNN's TF32 convolutions (PyTorch's default): which rows run on the tensor cores, the TF32
twin of a datasheet checked against the roofline by hand, and a module step priced with them."""
from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn

from nslib.data.gpus import GPU
from nslib.model.inputs import kernel_frame
from nslib.model.module_trace import trace_module
from nslib.model.stream import step_ms
from nslib.model.tf32 import tensor_for, tf32_gpu_ms, tf32_ms, tf32_peak, tf32_rows, tf32_sheet
from nslib.predictors.tensor_baselines import Roofline
from nslib.predictors.tc_gemm import GEMM

# an A100-like datasheet without, then with, its tensor-core figure (BF16 312 TFLOP/s)
PLAIN = GPU(name="Test GPU", mem_gb=40, mem_bw=1555, num_sm=108, cores_per_sm=64,
            clock_mhz=1410, peak_gflops=19500, l2_mb=40, key="Test_GPU")
TENSOR = replace(PLAIN, bf16_gflops=312000)


def _net():
    return nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, padding=1, groups=64),   # depthwise: FP32
                         nn.Conv2d(64, 256, 3, stride=2),              # no Winograd form
                         nn.Flatten(), nn.Linear(256 * 15 * 15, 10))   # a matmul: FP32


def _trace(mode="inf"):
    with torch.device("meta"):
        model, x = _net(), torch.randn(4, 3, 32, 32)
    return trace_module(model, [x], mode=mode)


def test_tf32_peak_is_half_the_bf16_one():
    assert tf32_peak(PLAIN) is None
    assert tf32_peak(TENSOR) == 156000


def test_only_ungrouped_fp32_convolutions_run_in_tf32():
    tr = _trace()
    assert not tf32_rows(tr, PLAIN).any()      # no tensor-core figure: nothing on them
    flagged = tr[tf32_rows(tr, TENSOR)]
    # the two ungrouped convs' implicit GEMMs; not the depthwise conv, the Linear, Winograd's
    # products (a bmm row) or its transforms
    assert flagged["aten"].str.startswith("aten.convolution.").all()
    assert flagged["cls"].eq("linear").all()
    assert [(r.M, r.N, r.K) for r in flagged.itertuples()] == [
        (4 * 32 * 32, 27, 64), (4 * 15 * 15, 64 * 9, 256)]
    train = _trace("train")
    back = train[tf32_rows(train, TENSOR) & train["aten"].str.contains("backward").to_numpy()]
    # the strided conv's data and weight gradients (the first conv's input needs none)
    assert len(back) == 3


def test_tf32_twin_is_the_roofline_of_4_byte_operands():
    rows = pd.DataFrame({"B": [1.0, 1.0], "M": [4096.0, 16.0], "N": [576.0, 8192.0],
                         "K": [256.0, 8192.0], "tf32": [True, True]})
    got = tf32_ms(rows, TENSOR, Roofline(GEMM))
    m, n, k = 4096.0 * np.array([1, 0]) + 16.0 * np.array([0, 1]), np.array([256.0, 8192.0]), \
        np.array([576.0, 8192.0])
    by_hand = np.maximum(2 * m * n * k / 156000e9, 4 * (m * k + k * n + m * n) / 1555e9) * 1e3
    assert np.allclose(got, by_hand)
    sheet = tf32_sheet(TENSOR)
    assert (sheet["bf16_gflops"], sheet["mem_bw"], sheet["l2_mb"]) == (156000, 777.5, 20)
    assert np.isnan(tf32_ms(rows.assign(tf32=[False, True]), TENSOR, Roofline(GEMM))[0])
    with pytest.raises(ValueError, match="Bf16FLOPs"):
        tf32_sheet(PLAIN)


def test_a_wide_3x3_conv_leaves_winograd_for_tf32():
    with torch.device("meta"):
        conv, x = nn.Conv2d(256, 256, 3, padding=1), torch.randn(8, 256, 28, 28)
    tr = trace_module(conv, [x])
    assert "bmm" in kernel_frame(tr, PLAIN, tf32=True)["cls"].tolist()   # FP32: Winograd wins
    # TF32 is off unless asked for (docs/decisions.md): the frame is the FP32 one
    assert not kernel_frame(tr, TENSOR)["tf32"].any()
    assert kernel_frame(tr, TENSOR)["cls"].tolist() == kernel_frame(tr, PLAIN)["cls"].tolist()
    on_tensor = kernel_frame(tr, TENSOR, tf32=True)
    assert on_tensor["cls"].tolist() == ["linear"] and on_tensor["tf32"].all()


def test_implicit_gemm_rereads_are_l2_hits_of_the_twin():
    tr = _trace()
    conv = tr[tf32_rows(tr, TENSOR)].iloc[0]
    # the 3x3 'same' conv moves its input, filters and output once: 4x3x32x32 + 64x3x3x3
    # + 4x64x32x32, not its im2col operand (4096 x 27)
    assert conv["dram_elems"] == 4 * 3 * 32 * 32 + 64 * 27 + 4 * 64 * 32 * 32
    winograd = {k for _, form in tr.attrs["alternatives"] for k in form}
    convs = (tr["aten"].str.startswith("aten.convolution.") & tr["cls"].isin(["linear", "bmm"])
             & ~tr["kid"].isin(winograd))
    assert convs.sum() == 3 and tr.loc[convs, "dram_elems"].notna().all()   # depthwise too
    assert tr.loc[tr["kid"].isin(winograd), "dram_elems"].isna().all()
    assert tr.loc[~tr["aten"].str.startswith("aten.convolution."), "dram_elems"].isna().all()
    seen = []

    class Spy:
        def predict(self, frame):
            seen.append(frame)
            return np.zeros(len(frame))

    frame = kernel_frame(tr, TENSOR, tf32=True)
    tf32_ms(frame, TENSOR, Spy())
    got = seen[0].iloc[0]
    m, n, k = 4096, 64, 27
    extra = m * k + k * n + m * n - conv["dram_elems"]   # read again from L2
    assert got["l2_mb"] == pytest.approx(20 + 2 * extra / 2 ** 20)
    # the twin's DRAM bytes beyond its L2 are the conv's own, at 2 bytes per element
    assert 2 * (m * k + k * n + m * n) - got["l2_mb"] * 2 ** 20 == pytest.approx(
        2 * conv["dram_elems"] - 20 * 2 ** 20)


class _Fixed:
    """A fitted 16-bit GEMM predictor that answers 0.5 ms for every GEMM."""

    def predict(self, frame):
        return np.full(len(frame), 0.5)


def test_step_takes_the_tensor_price_of_tf32_rows(monkeypatch):
    frame = kernel_frame(_trace(), TENSOR, tf32=True)
    tf32, notes = tf32_gpu_ms(frame, TENSOR, _Fixed())
    assert notes == [] and np.isfinite(tf32).sum() == 2
    assert np.array_equal(np.isfinite(tf32), frame["tf32"].to_numpy())
    assert tf32_gpu_ms(kernel_frame(_trace(), PLAIN), PLAIN, _Fixed()) == (None, [])

    class Flat:   # an FP32 predictor: 1 ms a kernel, no dispatch floor of its own
        plain_sum = False

        def predict(self, f):
            return np.ones(len(f))

    import nslib.model.stream as stream
    monkeypatch.setattr(stream, "_floor_parts",
                        lambda pred, f, data: (np.zeros(len(f)), np.ones(len(f)), 0.0))
    plain = step_ms(Flat(), frame, 5.0)
    mixed = step_ms(Flat(), frame, 5.0, other_gpu_ms=tf32)
    assert np.allclose(mixed[frame["tf32"].to_numpy()], 0.5)
    assert np.allclose(mixed[~frame["tf32"].to_numpy()], plain[~frame["tf32"].to_numpy()])
    # cuDNN picks the faster algorithm: a TF32 price above the FP32 one leaves the FP32 one
    slower = step_ms(Flat(), frame, 5.0, other_gpu_ms=np.where(np.isfinite(tf32), 3.0, np.nan))
    assert np.allclose(slower, plain)


def test_without_16bit_data_tf32_rows_keep_their_fp32_price(tmp_path):
    from nslib.data.settings import Settings

    frame = kernel_frame(_trace(), TENSOR, tf32=True)
    tf32, notes = tf32_gpu_ms(frame, TENSOR, "nslib", Settings(mixed=tmp_path / "none"))
    assert tf32 is None and "priced as FP32" in notes[0]


def test_tensor_predictor_beside_each_fp32_one():
    assert tensor_for("nslib") == "nslib" and tensor_for("roofline") == "roofline"
    assert tensor_for("neusight") == "nslib"


def test_module_step_on_a_tensor_core_datasheet(data_dir, mixed_dir):
    """End to end with the rooflines (FP32 and tensor-core): a wide conv runs in TF32 where the
    datasheet gives the tensor-core peak, and the step is faster; without it nothing changes."""
    from nslib.data.settings import Settings
    from nslib.model.predict import predict_model
    from nslib.model.step import Step

    def wide():
        return nn.Sequential(nn.Conv2d(256, 256, 3, padding=1), nn.ReLU())

    s = Settings(quick=True, progress=False)
    got = {}
    for label, gpu in (("plain", PLAIN), ("tensor", TENSOR)):
        with warnings.catch_warnings():   # any datasheet-range notes are not the point
            warnings.simplefilter("ignore")
            frame, summ = predict_model(gpu, wide, Step(1, 1, "train"),
                                        inputs=[(16, 256, 28, 28)], predictor="roofline",
                                        tensor_predictor="roofline", settings=s, tf32=True)
        got[label] = (frame, summ)
    plain, tensor = got["plain"][1], got["tensor"][1]
    # the forward and the weight gradient (the input data gets no gradient)
    assert plain["tf32_kernels"] == 0 and tensor["tf32_kernels"] == 2
    assert tensor["e2e_ms"] < plain["e2e_ms"]
    frame = got["tensor"][0]
    conv = frame[frame["tf32"]].iloc[0]
    m, n, k = conv["M"], conv["K"], conv["N"]
    # the forward conv's time: the tensor roofline of its 4-byte operands at the TF32 peak
    assert conv["pred_ms"] == pytest.approx(max(2 * m * n * k / 156000e9,
                                                4 * (m * k + k * n + m * n) / 1555e9) * 1e3)


def test_cli_says_which_convolutions_run_in_tf32(tmp_path, data_dir, mixed_dir, capsys):
    import json

    from nslib.cli import main

    (tmp_path / "net.py").write_text(
        "import torch.nn as nn\n\n\nclass Net(nn.Sequential):\n    def __init__(self):\n"
        "        super().__init__(nn.Conv2d(256, 256, 3, padding=1), nn.ReLU())\n")
    sheet = tmp_path / "gpu.json"
    sheet.write_text(json.dumps(TENSOR.to_json()))
    args = ["predict", "--gpu", str(sheet), "--module", f"{tmp_path / 'net.py'}:Net",
            "--inputs", "16x256x28x28", "--predictor", "roofline", "--quick"]
    assert main(args) == 0
    assert "TF32" not in capsys.readouterr().out      # off unless asked for
    args.append("--tf32")
    assert main(args) == 0
    assert "(1 convolution kernel in TF32 on tensor cores)" in capsys.readouterr().out
    assert main(args + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tf32_kernels"] == 1
    assert main(["predict", "--gpu", str(sheet), "--model", "gpt2_large", "--batch", "1",
                 "--seq", "8", "--tf32"]) == 2
    assert "--tf32 applies to a module" in capsys.readouterr().err


def test_allowing_tf32_never_makes_a_step_slower(monkeypatch):
    """The rooflines pick the TF32 implicit GEMM of a wide 3x3 conv over Winograd; when the
    16-bit predictor prices it slower than Winograd's FP32 kernels, the FP32 step is kept."""
    import nslib.model.stream as stream
    from nslib.kernels import sizes
    from nslib.model.module_predict import priced_frame

    class Roof:   # the FP32 roofline, no dispatch floor of its own
        plain_sum = False

        def predict(self, f):
            return sizes.roofline_ms(f)

    class Tensor:
        def __init__(self, ms):
            self.ms = ms

        def predict(self, f):
            return np.full(len(f), self.ms)

    monkeypatch.setattr(stream, "_floor_parts",
                        lambda pred, f, data: (np.zeros(len(f)), np.ones(len(f)), 0.0))
    with torch.device("meta"):
        conv, x = nn.Conv2d(256, 256, 3, padding=1), torch.randn(8, 256, 28, 28)
    tr = trace_module(conv, [x])
    fp32, _ = priced_frame(tr, TENSOR, Roof(), 5.0)
    assert "bmm" in fp32["cls"].tolist() and not fp32["tf32"].any()    # Winograd
    slow, _ = priced_frame(tr, TENSOR, Roof(), 5.0, tf32=True, tensor=Tensor(100.0))
    assert slow["cls"].tolist() == fp32["cls"].tolist() and not slow["tf32"].any()
    assert slow["pred_ms"].sum() == pytest.approx(fp32["pred_ms"].sum())
    fast, _ = priced_frame(tr, TENSOR, Roof(), 5.0, tf32=True, tensor=Tensor(0.01))
    assert fast["cls"].tolist() == ["linear"] and fast["tf32"].all()
    assert fast["pred_ms"].sum() < fp32["pred_ms"].sum()


def test_only_fp32_convolutions_and_a_note_without_a_tensor_peak():
    from nslib.model.module_predict import priced_frame

    for dtype in (torch.float64, torch.float16):
        with torch.device("meta"):
            conv = nn.Conv2d(64, 64, 3, padding=1).to(dtype)
            x = torch.randn(4, 64, 28, 28, dtype=dtype)
        tr = trace_module(conv, [x])
        assert tr["dram_elems"].isna().all() and not tf32_rows(tr, TENSOR).any()

    class Flat:
        plain_sum = True   # the plain sum: no launch gap, no host term

        def predict(self, f):
            return np.full(len(f), 1e-4)

    frame, notes = priced_frame(_trace(), PLAIN, Flat(), 5.0, tf32=True, tensor=_Fixed())
    assert not frame["tf32"].any() and "no tensor-core peak" in notes[0]
    # in the plain sum a TF32 price below the launch gap is not raised to it
    class Tiny:
        def predict(self, f):
            return np.full(len(f), 1e-5)

    quick = priced_frame(_trace(), TENSOR, Flat(), 5.0, tf32=True, tensor=Tiny())[0]
    assert np.allclose(quick.loc[quick["tf32"], "pred_ms"], 1e-5)
