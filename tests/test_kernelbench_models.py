"""Any PyTorch module as a step (issue: forecast any PyTorch model): the kernels a CNN, a
recurrent layer and a custom attention block launch, by hand; a data-dependent shape's clear
error; the per-call dispatch of a library call; KernelBench level-2/3 problems scored on a fake
campaign (and the shared one when there is one)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kernelbench_fixture import fake_root
import torch
import torch.nn as nn

from nslib.cli import main
from nslib.data import kernelbench as kb
from nslib.data.settings import Settings
from nslib.evaluation import kernelbench_models as km
from nslib.model.module_trace import ProblemError, problem_trace, trace_module
from nslib.model.stream import host_bound



def _cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(8 * 15 * 15, 10))


def test_tiny_cnn_kernels_by_hand():
    with torch.device("meta"):
        model, x = _cnn(), torch.randn(2, 3, 32, 32)
    tr = trace_module(model, [x])  # eval mode: the batch norm applies its running statistics
    # the 3x3 stride-1 conv: the implicit GEMM, (2 x 30 x 30 positions) x (3 x 3 x 3) @ 8, and
    # beside it Winograd F(4x4, 3x3): 2 x 8 x 8 tiles of 4x4 outputs (30 -> 8 per side), 36
    # transformed points each; the datasheet picks one (kernel_frame)
    assert tr["op"].tolist() == ["linear", "mem", "mem", "bmm", "mem", "addu", "relu", "mem",
                                 "linear"]
    assert tr.attrs["alternatives"] == [((0,), (1, 2, 3, 4))]
    conv = tr.iloc[0]
    assert (conv["M"], conv["N"], conv["K"]) == (2 * 30 * 30, 27, 8)
    filt, tin, gemm, tout = tr.iloc[1], tr.iloc[2], tr.iloc[3], tr.iloc[4]
    assert filt["bytes"] == 4 * (9 + 36) * 3 * 8   # 3x3 filters read, 6x6 transforms written
    # each Winograd kernel reads the one before; the next op reads either form's output
    assert tr["inputs"].iloc[3] == (1, 2) and tr["inputs"].iloc[4] == (3,)
    assert set(tr["inputs"].iloc[5]) == {0, 4}
    assert tin["bytes"] == 4 * (2 * 3 * 32 * 32 + 36 * 128 * 3)   # input read, tiles written
    assert (gemm["B"], gemm["M"], gemm["N"], gemm["K"]) == (36, 128, 3, 8)
    assert gemm["flops"] == 2 * 36 * 128 * 3 * 8
    assert tout["bytes"] == 4 * (36 * 128 * 8 + 2 * 8 * 30 * 30)   # products read, output written
    assert tr.iloc[5]["B"] * tr.iloc[5]["H"] == 2 * 8 * 30 * 30
    pool = tr.iloc[7]  # reads the 2x8x30x30 input, writes values and int64 indices (2x8x15x15)
    assert pool["bytes"] == 4 * 14400 + 4 * 3600 + 8 * 3600
    fc = tr.iloc[8]
    assert (fc["M"], fc["N"], fc["K"]) == (2, 1800, 10)
    model.train(True)  # as KernelBench runs a module: batch statistics, two streams read
    train = trace_module(model, [x], eval_mode=False)
    assert "add" in train.loc[train["aten"].str.contains("batch_norm"), "op"].tolist()
    # any other convolution is the implicit GEMM: (2 x 15 x 15 positions) x (3 x 3 x 3) @ 8
    for conv in (nn.Conv2d(3, 8, 3, stride=2), nn.Conv2d(3, 8, 3, dilation=2, padding=2),
                 nn.Conv2d(4, 8, 3, groups=2), nn.Conv2d(3, 8, (3, 1)), nn.Conv1d(3, 8, 3)):
        conv = conv.to("meta")
        shape = (2, conv.in_channels) + (32,) * (conv.weight.dim() - 2)
        rows = trace_module(conv, [torch.empty(shape, device="meta")])
        assert rows["op"].tolist() == ["bmm" if conv.groups > 1 else "linear"], conv
        assert "alternatives" not in rows.attrs
    g = trace_module(nn.Conv2d(3, 8, 3, stride=2).to("meta"),
                     [torch.empty(2, 3, 32, 32, device="meta")]).iloc[0]
    assert (g["M"], g["N"], g["K"]) == (2 * 15 * 15, 27, 8)


def _roofline_s(rows, gpu):
    return np.maximum(rows["flops"] / (gpu.peak_gflops * 1e9),
                      rows["bytes"] / (gpu.mem_bw * 1e9)).sum()


def test_a_3x3_convolution_runs_the_cheaper_algorithm():
    from nslib.data.gpus import GPU
    from nslib.model.inputs import kernel_frame
    gpu = GPU("Fake", 16, 900, 80, 64, 1500, 15000, 6)
    for cin, algo in ((3, ["linear"]), (256, ["memory", "memory", "bmm", "memory"])):
        net = nn.Sequential(nn.Conv2d(cin, 256, 3, padding=1), nn.ReLU()).to("meta")
        tr = trace_module(net, [torch.empty(8, cin, 56, 56, device="meta")])
        [((gemm,), wino)] = tr.attrs["alternatives"]
        by_kid = tr.set_index("kid")
        costs = [_roofline_s(by_kid.loc[list(k)], gpu) for k in ((gemm,), wino)]
        frame = kernel_frame(tr, gpu)
        # the thin layer pays more for its transforms than Winograd's quarter of the
        # multiplies saves; the wide one the other way round
        assert frame["kernel_class"].tolist() == algo + ["elementwise"]
        assert (costs[0] <= costs[1]) == (algo == ["linear"])
        assert "alternatives" not in frame.attrs
        assert frame.index.tolist() == list(range(len(algo) + 1))
        # nothing the storage model filed is lost with the dropped form, and every
        # dependency and free points at a kernel that is kept
        for c in ("params", "trainable"):
            assert frame[c].sum() == tr[c].sum() > 0
        assert sum(map(len, frame["allocs"])) == sum(map(len, tr["allocs"]))
        kept = set(frame["kid"])
        assert all(k in kept for ins in frame["inputs"] for k in ins)
        assert all(f in kept or f < 0 for fs in frame["frees"] for f in fs)
        assert frame["inputs"].iloc[-1] == (frame["kid"].iloc[-2],)   # the ReLU reads the conv


def test_config_traces_carry_no_alternatives():
    # a config's trace is fused, swept and split into stages, which keep every row: its
    # convolutions are the implicit GEMM alone (16-bit ones too)
    from nslib.model.recorder import Tracer
    assert not Tracer(nn.Linear(2, 2), {}).algorithms
    assert not Tracer(nn.Linear(2, 2), {}, half=True, algorithms=True).algorithms


def test_lstm_as_cudnn_runs_it():
    with torch.device("meta"):
        lstm, x = nn.LSTM(16, 32, num_layers=2, batch_first=True), torch.randn(4, 10, 16)
    tr = trace_module(lstm, [x])
    # per layer: one input-projection GEMM over the 10 steps, then per step the recurrent GEMM
    # and one pointwise kernel over the 4 gates
    assert len(tr) == 2 * (1 + 2 * 10)
    assert tr.iloc[0][["M", "N", "K"]].tolist() == [40, 16, 128]
    assert tr.iloc[21][["M", "N", "K"]].tolist() == [40, 32, 128]
    steps = tr.iloc[1:21]
    assert steps["op"].tolist() == ["linear", "add"] * 10
    assert steps.iloc[0][["M", "N", "K"]].tolist() == [4, 32, 128]
    assert tr["call"].nunique() == 1  # one operator call launches them all
    with torch.device("meta"):
        gru = nn.GRU(8, 16, bidirectional=True)
        gx = torch.randn(5, 3, 8)  # (steps, batch, features)
    g = trace_module(gru, [gx])
    assert len(g) == 2 * (1 + 2 * 5) and g.iloc[0][["M", "N", "K"]].tolist() == [15, 8, 48]


class _Attention(nn.Module):
    def __init__(self, d=64, heads=4):
        super().__init__()
        self.h = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.h) ** 0.5, dim=-1)
        return self.out((att @ v).transpose(1, 2).reshape(b, t, d))


def test_custom_attention_block_by_hand():
    with torch.device("meta"):
        block, x = _Attention(), torch.randn(2, 8, 64)
    tr = trace_module(block, [x])
    assert tr["cls"].tolist() == ["linear", "memory", "memory", "bmm", "elementwise",
                                  "softmax", "memory", "bmm", "memory", "linear"]
    scores = tr[tr["cls"] == "bmm"].iloc[0]  # 2 x 4 heads of (8 x 16) @ (16 x 8)
    assert scores[["B", "M", "N", "K"]].tolist() == [8, 8, 16, 8]
    sm = tr[tr["cls"] == "softmax"].iloc[0]
    assert (sm["B"], sm["H"]) == (2 * 4 * 8, 8)


def _pairs(conv, x):
    """Independent count of a transposed convolution's (input position, tap) pairs that land
    in its output: the same convolution of ones with one channel, summed (on the CPU)."""
    ones = getattr(torch.nn.functional, f"conv_transpose{x.dim() - 2}d")(
        torch.ones(1, 1, *x.shape[2:]), torch.ones(1, 1, *conv.kernel_size),
        stride=conv.stride, padding=conv.padding, output_padding=conv.output_padding,
        dilation=conv.dilation)
    return int(ones.sum())


@pytest.mark.parametrize("conv,shape", [
    (lambda: nn.ConvTranspose2d(8, 16, 3, stride=2, padding=1, output_padding=1), (2, 8, 10, 10)),
    (lambda: nn.ConvTranspose2d(8, 8, 5, padding=4), (1, 8, 16, 16)),     # padding crops
    (lambda: nn.ConvTranspose3d(4, 6, 3, stride=2, dilation=2, groups=2), (1, 4, 5, 6, 7)),
    (lambda: nn.ConvTranspose1d(3, 5, 4, stride=3, padding=2), (2, 3, 33))])
def test_transposed_convolution_is_its_outputs_gemm(conv, shape):
    # the implicit GEMM of the output: per output position the multiplies that meet an
    # input, the true count 2 x channel pairs x pairs that land; the backward is the
    # convolution it inverts (input gradient: input positions x (out channels x taps) @ in
    # channels, then the weight gradient, per group) and the bias gradient, per output channel
    with torch.device("meta"):
        conv, x = conv(), torch.randn(*shape, requires_grad=True)
    g, cin, cout = conv.groups, conv.in_channels, conv.out_channels
    y_pos = math.prod(conv(x).shape[2:]) * shape[0]
    x_pos, taps = math.prod(shape[2:]) * shape[0], math.prod(conv.kernel_size)
    true = 2 * cin * cout // g * shape[0] * _pairs(conv, torch.empty(shape, device="cpu"))
    fw = trace_module(conv, [x]).iloc[0]
    assert (fw["B"], fw["M"], fw["K"]) == (g, y_pos, cout // g)
    assert fw["N"] == round(true / (2 * y_pos * cout)) and fw["flops"] == pytest.approx(true)
    bw = trace_module(conv, [x], mode="train")
    gemms = bw[(bw["phase"] == "bw") & bw["cls"].isin(["linear", "bmm"])]
    assert gemms[["M", "N", "K"]].values.tolist() == [
        [x_pos, cout // g * taps, cin // g], [cin // g, x_pos, cout // g * taps]]
    assert (gemms["flops"] == 2 * x_pos * cin * cout // g * taps).all()
    assert bw["H"].iloc[-1] == cout


class _Losses(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 10)

    def forward(self, x, y, t):
        z = self.lin(x)
        return (nn.functional.cross_entropy(z, t) + nn.functional.huber_loss(z, y)
                + nn.functional.mse_loss(z, y) + torch.diag_embed(z).sum())


def test_losses_are_memory_passes():
    # cross entropy: log-softmax rows, then nll gathering (reads the 8 int64 targets and one
    # log-probability per target, writes 2 values); Huber / MSE read both 8 x 10 operands
    with torch.device("meta"):
        m, ins = _Losses(), [torch.randn(8, 16), torch.rand(8, 10), torch.randint(0, 10, (8,))]
    tr = trace_module(m, ins)
    assert not tr.attrs["unknown_ops"]
    ops = [a.split(".")[1] for a in tr["aten"]]
    assert [o for o in ops if o != "add"] == ["addmm", "_log_softmax", "nll_loss_forward",
                                             "huber_loss", "mse_loss", "diag_embed", "sum"]
    by = tr.assign(op_name=ops).drop_duplicates("op_name").set_index("op_name")
    assert by.loc["nll_loss_forward", "bytes"] == 8 * 8 + 8 * 4 + 2 * 4
    assert by.loc["huber_loss", "bytes"] == 2 * 80 * 4 + 4
    assert by.loc["diag_embed", "H"] == 8 * 10 * 10
    back = trace_module(m, ins, mode="train")
    assert not back.attrs["unknown_ops"]
    assert {"nll_loss_backward", "huber_loss_backward", "mse_loss_backward"} <= {
        a.split(".")[1] for a in back.loc[back["phase"] == "bw", "aten"]}


def test_data_dependent_shape_is_a_clear_error(tmp_path):
    path = tmp_path / "1_Dynamic.py"
    path.write_text("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n"
                    "    def forward(self, x):\n        return x[: int(x.sum().item())]\n"
                    "def get_inputs():\n    return [torch.randn(8, 8)]\n"
                    "def get_init_inputs():\n    return []\n")
    with pytest.raises(ProblemError, match="data-dependent shapes"):
        problem_trace(path)


class _Scheduled(nn.Module):
    """Built as vision transformers are: Python numbers read from tensors in the constructor
    (drop-path rates) and a buffer computed from an index grid."""

    def __init__(self, depth=3):
        super().__init__()
        self.rates = [x.item() for x in torch.linspace(0, 0.1, depth)]
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(depth))
        grid = torch.stack(torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij"))
        self.register_buffer("index", grid.flatten(1).sum(0))

    def forward(self, x):
        for block in self.blocks:
            x = torch.relu(block(x))
        return x


def test_a_constructor_that_reads_tensor_values_is_built():
    # built again with its small tensors on the CPU, then moved to meta: the same kernels
    trace = trace_module(_Scheduled().to("meta"), [torch.empty(8, 16, device="meta")])
    from nslib.model.module_trace import meta_trace
    got = meta_trace(_Scheduled, lambda: [torch.empty(8, 16)], "scheduled")
    assert list(got["cls"]) == list(trace["cls"]) and (got["cls"] == "linear").sum() == 3

    class Big(nn.Module):   # reads a value of a tensor too large to make for its value
        def __init__(self):
            super().__init__()
            self.n = int(torch.ones(2048, 1024).sum().item())

    with pytest.raises(ProblemError, match="building the module failed.*real data"):
        meta_trace(Big, lambda: [], "big")


class _OnTheGpu(nn.Module):
    """Written for a GPU, as research code is: ``.cuda()``, ``device="cuda"``, ``.to(dev)``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16).cuda()
        self.register_buffer("shift", torch.zeros(16, device="cuda"))

    def forward(self, x):
        x = x.cuda(non_blocking=True)
        return self.fc(x).to("cuda:0", torch.float32) + self.shift


def test_a_module_written_for_a_gpu_traces_on_meta():
    from nslib.model.module_trace import meta_trace
    got = meta_trace(_OnTheGpu, lambda: [torch.randn(8, 16)], "gpu code")
    assert list(got["cls"]) == ["linear", "elementwise"]   # no kernel for the moves
    # a dtype change still converts (a cast kernel), only the device is dropped
    class Cast(nn.Module):
        def forward(self, x):
            return x.to("cuda", torch.float16)
    assert list(meta_trace(Cast, lambda: [torch.randn(8, 16)], "cast")["cls"]) == ["memory"]

    class Amp(nn.Linear):      # CUDA autocast cannot run here: said, priced as FP32
        def forward(self, x):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return super().forward(x)
    from nslib.model.module_predict import trace_notes
    amp = meta_trace(lambda: Amp(4, 4), lambda: [torch.randn(2, 4)], "amp")
    if not torch.cuda.is_available():
        assert any("CUDA autocast" in n for n in trace_notes(amp))
    assert not any("autocast" in n for n in trace_notes(got))

    class Synced(nn.Linear):   # a torch.cuda call needs a GPU: said, with the fix
        def forward(self, x):
            torch.cuda.synchronize()
            return super().forward(x)
    if not torch.cuda.is_available():
        with pytest.raises(ProblemError, match=r"calls a torch.cuda function.*is_available"):
            meta_trace(lambda: Synced(4, 4), lambda: [torch.randn(2, 4)], "synced")


class _Chains(nn.Module):
    """A 2-D batch norm, a 2-D and a 4-D group norm, and a logsumexp (PyTorch's composites)."""

    def __init__(self):
        super().__init__()
        self.bn, self.gn, self.gn4 = nn.BatchNorm1d(16), nn.GroupNorm(4, 16), nn.GroupNorm(2, 4)

    def forward(self, x, y):
        return torch.logsumexp(self.gn(self.bn(x)), dim=1, keepdim=True), self.gn4(y)


def test_ops_that_launch_several_kernels_by_hand():
    with torch.device("meta"):
        model, x, y = _Chains(), torch.randn(8, 16), torch.randn(2, 4, 5, 5)
    tr = trace_module(model, [x, y], eval_mode=False)   # training: batch statistics
    rows = {a: tr[tr["aten"].str.contains(a)] for a in ("batch_norm", "group_norm", "logsumexp")}
    # 2-D batch norm (ATen's own, not cuDNN's): statistics, running-statistics update, apply
    bn = rows["batch_norm"]
    assert bn["op"].tolist() == ["mem", "mem", "addu"]
    assert bn["bytes"].tolist() == [4 * (128 + 32), 4 * 6 * 16, 4 * 2 * 128]
    # group norm: row moments, then (4-D, affine) the per-channel scale and shift, the apply
    gn = rows["group_norm"]
    assert gn["op"].tolist() == ["mem", "ln", "mem", "mem", "ln"]
    assert gn["bytes"].iloc[0] == 4 * (128 + 2 * 8 * 4)
    assert (gn["B"].iloc[1], gn["H"].iloc[1]) == (8 * 4, 4)
    assert gn["bytes"].iloc[3] == 4 * (2 * 2 * 2 + 4 * 2 * 4)
    assert (gn["B"].iloc[4], gn["H"].iloc[4]) == (2 * 2, 2 * 25)
    # logsumexp: amax, abs, eq, masked_fill_, x - max, exp, sum, log_, add_
    lse = rows["logsumexp"]
    assert lse["op"].tolist() == ["mem", "mulu", "mem", "mem", "addu", "tanh", "mem", "tanh",
                                  "add"]
    assert lse["bytes"].iloc[4] == 4 * 2 * 128 and lse["bytes"].iloc[0] == 4 * (128 + 8)
    # one call each, every kernel reading the one before
    for part in rows.values():
        for call in part["call"].unique():
            kids = part.loc[part["call"] == call, "kid"].tolist()
            assert all(tr.set_index("kid").loc[k, "inputs"] == (p,)
                       for p, k in zip(kids, kids[1:]))
    assert len(set(lse["call"])) == 1 and len(set(bn["call"])) == 1
    # eval mode: the running statistics, one elementwise pass
    ev = trace_module(model, [x, y])
    assert ev.loc[ev["aten"].str.contains("batch_norm"), "op"].tolist() == ["addu"]


def test_one_dispatch_per_operator_call():
    frame = pd.DataFrame({"phase": ["fw"] * 4, "call": [0, 1, 1, 1]})
    gpu = np.full(4, 0.001)
    floor = np.full(4, 0.02)
    # per kernel: the host needs 4 floors, the phase takes 80 us
    assert host_bound(frame, gpu, floor).sum() == pytest.approx(0.08)
    again = frame["call"].duplicated().to_numpy()  # what step_ms(per_call=True) charges
    per_call = np.where(again, 0.003, floor)
    assert host_bound(frame, gpu, per_call).sum() == pytest.approx(0.046)


def _problem(body: str, inputs: str, init: str = "[]", ctor: str = "") -> str:
    init_fn = f"    def __init__(self):\n        super().__init__()\n        {ctor}\n"
    return (f"import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n{init_fn}"
            f"    def forward(self, x):\n        return {body}\n\n"
            f"def get_inputs():\n    return {inputs}\n\n"
            f"def get_init_inputs():\n    return {init}\n")


LEVEL3 = {
    "1_TinyCNN.py": _problem("self.net(x)", "[torch.randn(2, 3, 32, 32)]",
                             ctor="self.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())"),
    "2_LSTM.py": _problem("self.rnn(x)[0]", "[torch.randn(4, 10, 16)]",
                          ctor="self.rnn = nn.LSTM(16, 32, batch_first=True)"),
    "3_Bessel.py": _problem("torch.special.i0(x)", "[torch.randn(64, 64)]",
                            ctor="pass"),
}


LEVEL1 = {   # kernel-table rows (a ReLU, a GEMM) and an operator the table has no class for
    "1_ReLU.py": _problem("torch.relu(x)", "[torch.randn(16, 4096)]", ctor="pass"),
    "2_Conv.py": _problem("self.conv(x)", "[torch.randn(2, 3, 32, 32)]",
                          ctor="self.conv = nn.Conv2d(3, 8, 3)"),
    "3_Matmul.py": _problem("x @ x", "[torch.randn(64, 64)]", ctor="pass"),
}
MEANS = {"1_ReLU.py": 0.06, "3_Matmul.py": 0.07}   # ms: h is 50 us, a GEMM call 70 at most


@pytest.fixture
def campaign(tmp_path):
    root, camp = fake_root(tmp_path)
    entries = {}
    for level, files in ((1, LEVEL1), (3, LEVEL3)):
        (camp / f"level{level}").mkdir(parents=True)
        for name, text in files.items():
            (camp / f"level{level}" / name).write_text(text)
        # the trials spread 1, 2 and 6 % of their mean (0.2 ms, but level 1's ReLU and GEMM)
        entries[f"level{level}"] = {k: {"mean": MEANS.get(k, 0.2), "std": 0.002 * [1, 2, 6][i],
                                        "hardware": "Fake GPU 9"}
                                    for i, k in enumerate(files)}
    (camp / kb.TIMING_FILE).write_text(json.dumps(entries))
    return root


def test_level3_scored_with_unpriced_listed(campaign, data_dir):
    steps = km.evaluate(["roofline"], root=campaign, level=3,
                        settings=Settings(progress=False))
    by = steps.set_index("problem")
    assert by.loc["2_LSTM.py", "n_kernels"] == 1 + 2 * 10
    assert by.loc["3_Bessel.py", "reason"] == "aten ops without a kernel mapping"
    assert by.loc["3_Bessel.py", "unpriced"] == "i0 x1"
    assert by.loc["3_Bessel.py", "unpriced_share"] == 1.0
    assert np.isnan(by.loc["3_Bessel.py", "pred_roofline"])
    assert (by.loc[["1_TinyCNN.py", "2_LSTM.py"], "pred_roofline"] > 0).all()
    assert [km.family(p, 3) for p in by.index] == ["cnn", "recurrent", "other"]
    js = km.summary_json(steps, "roofline")
    assert js["Fake GPU 9"]["n_priced"] == 2 and js["Fake GPU 9"]["n_total"] == 3
    # the trials' spread: std over mean per problem, its median (%) per GPU and family
    assert by["trial_cv"].tolist() == pytest.approx([0.01, 0.02, 0.06])
    assert js["Fake GPU 9"]["trial_cv"] == pytest.approx(2.0)
    assert km.summary(steps, by=("family",))["trial_cv"].to_dict() == pytest.approx(
        {"cnn": 1.0, "other": 6.0, "recurrent": 2.0})
    assert "trial_cv" not in km.summary(steps.drop(columns="trial_cv"))


def test_level1_scores_the_operators_the_kernel_table_skips(campaign, data_dir):
    steps = km.evaluate(["roofline"], root=campaign, level=1,
                        settings=Settings(progress=False))
    assert steps["problem"].tolist() == ["2_Conv.py"]   # the ReLU is the kernel table's
    assert steps["family"].tolist() == ["convolution"] and steps["pred_roofline"].iloc[0] > 0
    names = {"33_BatchNorm.py": "normalization", "43_Max_Pooling_3D.py": "pooling",
             "51_Argmax_over_a_dimension.py": "reduction", "89_cumsum.py": "reduction",
             "94_MSELoss.py": "loss", "25_Swish.py": "other",
             "75_conv_transposed_2D_asymmetric_input.py": "convolution"}
    assert {p: km.family(p, 1) for p in names} == names
    with pytest.raises(ValueError, match="level must be 1"):
        km.evaluate(["roofline"], root=campaign, level=4, settings=Settings(progress=False))


def test_price_issues_calls_at_the_campaigns_host(campaign, data_dir):
    # the campaign's per-call cost h is its host's one-op floor: each call costs h x its
    # class ratio (step_ms with host_floor_ms) and the model's call adds h once; a campaign
    # without a bound keeps the predictor's own floors; the plain sum has no host term
    from nslib.evaluation import kernelbench as level1
    from nslib.model.inputs import kernel_frame
    from nslib.model import stream
    from nslib.model.stream import LAUNCH_US, HostFloor, floors, step_ms
    from nslib.predictors import trained
    steps = km.problem_steps(campaign, 3, progress=False)
    steps = steps[steps["problem"] == "1_TinyCNN.py"]
    pred = trained("roofline", Settings(progress=False))
    camp = steps["campaign"].iloc[0]
    frame = kernel_frame(level1.trace_of(steps["path"].iloc[0]),
                         kb.datasheets(campaign)["Fake GPU 9"])
    h = 0.02
    got = km.price(pred, steps, pd.Series({camp: h}), campaign)[0]
    want = step_ms(pred, frame, LAUNCH_US, per_call=True, host_floor_ms=h).sum() + h
    assert got == pytest.approx(want)
    assert got != pytest.approx(step_ms(pred, frame, LAUNCH_US, per_call=True).sum() + h)
    unknown = km.price(pred, steps, pd.Series(dtype=float), campaign)[0]
    assert unknown == pytest.approx(step_ms(pred, frame, LAUNCH_US, per_call=True).sum())
    plain = km.price(pred, steps, pd.Series({camp: h}), campaign, launch_us=None)[0]
    assert plain == pytest.approx(step_ms(pred, frame, None).sum() + h)
    # a class's measured bound caps h x its ratio (the convolution's GEMM is a linear call),
    # never under h; the GPU time and a further kernel's C++ launch (h's share) keep h's
    lin = (frame["cls"] == "linear").to_numpy()
    bound = HostFloor(h, (("linear", 1.5 * h),))
    assert (bound.dispatch_ms(frame, np.full(len(frame), 3.0)) == np.where(lin, 1.5 * h, 3 * h)
            ).all()
    assert (HostFloor(h, (("linear", 0.0),)).dispatch_ms(frame, np.full(len(frame), 3.0))
            == np.where(lin, h, 3 * h)).all()
    ratio = floors(pred, frame, host_floor_ms=h) / h
    assert floors(pred, frame, host_floor_ms=bound) == pytest.approx(
        np.where(lin, np.minimum(ratio, 1.5) * h, ratio * h))
    plain_h, capped_h = (stream._stream_parts(pred, frame, LAUNCH_US, None, host_floor_ms=v)
                         for v in (h, bound))
    assert (plain_h[1] == capped_h[1]).all() and (capped_h[3] == h).all()
    capped = km.price(pred, steps, pd.Series({camp: h}), campaign,
                      class_harness={camp: {"linear": 1.5 * h}})[0]
    assert capped == pytest.approx(
        step_ms(pred, frame, LAUNCH_US, per_call=True, host_floor_ms=bound).sum() + h)
    assert capped < got


def test_level1_bounds_each_classs_call(campaign, data_dir):
    # the fixture's level-1 GEMM leaves h beyond its roofline (h's own bound): a linear call
    # costs h, not h x the training hosts' linear ratio, so the CNN's step is cheaper
    from nslib.evaluation import kernelbench as level1
    rows = level1.problem_rows(campaign, 1, progress=False)[0]
    h, by_class = level1.harness_ms(rows), level1.class_harness_ms(rows)
    camp = rows["campaign"].iloc[0]
    assert by_class[camp]["linear"] < 1.5 * h[camp]
    steps = km.evaluate(["roofline"], root=campaign, level=3, settings=Settings(progress=False))
    cnn = steps[steps["problem"] == "1_TinyCNN.py"]
    from nslib.predictors import trained
    pred = trained("roofline", Settings(progress=False))
    unbounded = km.price(pred, cnn, h, campaign)[0]
    assert cnn["pred_roofline"].iloc[0] == pytest.approx(
        km.price(pred, cnn, h, campaign, class_harness=by_class)[0])
    assert cnn["pred_roofline"].iloc[0] < unbounded


def test_cli_eval_models_kernelbench(campaign, data_dir, capsys):
    assert main(["eval-models", "--kernelbench", str(campaign), "--level", "3",
                 "--predictor", "roofline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["Fake GPU 9"]) == {"median_error", "n_priced", "n_total", "trial_cv"}
    assert main(["eval-models", "--kernelbench", str(campaign), "--logo"]) == 2
    assert "drop --logo" in capsys.readouterr().err


# ----- the launch of a library call's further kernels, and the module front door

def test_library_launch_is_a_share_of_the_hosts_call():
    from nslib.model.stream import LIBRARY_LAUNCH_SHARE, library_launch_ms
    # 0.175 of a 40 us operator call: 7 us a further kernel; never under the 3 us launch gap
    assert library_launch_ms(0.04) == pytest.approx(LIBRARY_LAUNCH_SHARE * 0.04)
    assert library_launch_ms(np.array([0.001, 0.04])).tolist() == pytest.approx(
        [0.003, LIBRARY_LAUNCH_SHARE * 0.04])
    assert library_launch_ms(0.04, launch_us=10.0) == pytest.approx(0.01)


def test_recurrent_step_issued_at_the_library_launch(data_dir):
    # an LSTM's per-step kernels on a slow host: the call costs the host one dispatch, every
    # further kernel a C++ launch (library_launch_ms), and the GPU cannot run them faster
    from nslib.model.inputs import kernel_frame, resolve_gpu
    from nslib.model.stream import library_launch_ms, step_ms
    from nslib.predictors import trained
    with torch.device("meta"):
        lstm, x = nn.LSTM(16, 32, num_layers=2, batch_first=True), torch.randn(4, 10, 16)
    frame = kernel_frame(trace_module(lstm, [x]), resolve_gpu("V100"))
    pred = trained("roofline", Settings(progress=False))
    h = 0.2   # a host whose one-operator call takes 200 us: host-bound
    got = step_ms(pred, frame, per_call=True, host_floor_ms=h).sum()
    further = (len(frame) - 1) * float(library_launch_ms(h))
    assert further < got < further + 3 * h   # plus the one call's dispatch (h x class ratio)
    # a plain sum (no host term) ignores it
    assert step_ms(pred, frame, None, per_call=True).sum() < got


def _net_file(tmp_path):
    path = tmp_path / "mynet.py"
    path.write_text("import torch.nn as nn\n\n"
                    "def Net():\n"
                    "    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),\n"
                    "                         nn.MaxPool2d(2), nn.Flatten(),\n"
                    "                         nn.Linear(8 * 15 * 15, 10))\n")
    return path


def test_predict_model_takes_a_module(tmp_path, data_dir):
    from nslib.model.predict import predict_model
    s = Settings(progress=False)
    frame, summ = predict_model("V100", _cnn, predictor="roofline", inputs=[(2, 3, 32, 32)],
                                settings=s)
    # the same kernels as the hand-checked trace above, priced as one inference forward
    assert frame["kernel_class"].tolist() == ["linear", "elementwise", "elementwise", "memory",
                                              "linear"]
    assert frame.iloc[0][["M", "N", "K"]].tolist() == [2 * 30 * 30, 27, 8]
    assert summ["e2e_ms"] == pytest.approx(frame["pred_ms"].sum())
    assert summ["bw_ms"] == 0 and summ["unpriced"] == {} and summ["unpriced_share"] == 0
    # a built module, a FILE.py:NAME factory and a KernelBench-style file give the same step
    with torch.device("meta"):
        built = _cnn()
    same = [predict_model("V100", built, predictor="roofline", inputs=[(2, 3, 32, 32)],
                          settings=s)[1]["e2e_ms"],
            predict_model("V100", f"{_net_file(tmp_path)}:Net", predictor="roofline",
                          inputs=[(2, 3, 32, 32)], settings=s)[1]["e2e_ms"]]
    assert same == pytest.approx([summ["e2e_ms"]] * 2)
    kb_file = tmp_path / "1_TinyCNN.py"
    kb_file.write_text(LEVEL3["1_TinyCNN.py"])
    _, k = predict_model("V100", str(kb_file), predictor="roofline", settings=s)
    assert k["n_kernels"] == 2 and k["e2e_ms"] > 0


def test_predict_module_errors_say_the_fix(tmp_path, data_dir):
    from nslib.model.module_predict import parse_shapes
    from nslib.model.predict import predict_model
    from nslib.model.step import Step
    s = Settings(progress=False)
    with pytest.raises(ValueError, match="give the inputs"):
        predict_model("V100", f"{_net_file(tmp_path)}:Net", predictor="roofline", settings=s)
    with pytest.raises(ValueError, match="no module class or factory named 'Nope'"):
        predict_model("V100", f"{_net_file(tmp_path)}:Nope", predictor="roofline",
                      inputs=[(1, 3, 32, 32)], settings=s)
    with pytest.raises(ValueError, match="FP32 step.*drop --dtype"):
        predict_model("V100", _cnn, Step(2, 1, "inf", dtype="bf16"), "roofline",
                      inputs=[(2, 3, 32, 32)],
                      settings=s)
    with pytest.raises(ValueError, match=r"cannot price this module: 100%.*i0\.default x1"):
        predict_model("V100", lambda: _Bessel(), predictor="roofline", inputs=[(8, 8)],
                      settings=s)
    with pytest.raises(ValueError, match="data-dependent shapes"):
        predict_model("V100", lambda: _Dynamic(), predictor="roofline", inputs=[(8, 8)],
                      settings=s)
    with pytest.raises(ValueError, match="different dtypes.*refuses it on a GPU"):
        predict_model("V100", lambda: nn.Linear(8, 4), predictor="roofline",
                      inputs=parse_shapes("2x8:int64"), settings=s)
    with pytest.raises(ValueError, match="launches no kernel"):
        predict_model("V100", lambda: nn.Identity(), predictor="roofline", inputs=[(8, 8)],
                      settings=s)
    with pytest.raises(ValueError, match="give the step"):
        predict_model("V100", "gpt2_large")
    assert parse_shapes("8x3x224x224, 8x10") == [(8, 3, 224, 224), (8, 10)]
    with pytest.raises(ValueError, match="8x3x224x224"):
        parse_shapes("8x3x224x")


class _Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.mask, self.lin = torch.ones(4), nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * self.mask.to(x.device)


class _Bessel(nn.Module):
    def forward(self, x):
        return torch.special.i0(x)


class _Dynamic(nn.Module):
    def forward(self, x):
        return x[: int(x.sum().item())]


class _Branch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) if x.sum() > 0 else x


def test_what_a_meta_trace_cannot_know_is_said(tmp_path, data_dir):
    from nslib.model.predict import predict_model
    s = Settings(progress=False)
    # a branch on data is taken as True, and said; a 16-bit module is priced as FP32, and said
    _, out = predict_model("V100", lambda: _Branch(), predictor="roofline", inputs=[(4, 8)],
                           settings=s)
    assert out["n_kernels"] >= 1 and any("branched on 1 tensor value" in w
                                         for w in out["warnings"])
    _, out = predict_model("V100", lambda: nn.Linear(8, 8).half(), predictor="roofline",
                           inputs=[torch.randn(4, 8, dtype=torch.float16)], settings=s)
    assert any("holds float16 tensors" in w for w in out["warnings"])
    _, out = predict_model("V100", lambda: nn.Linear(8, 8), predictor="roofline",
                           inputs=[(4, 8)], settings=s)
    assert not [w for w in out["warnings"] if w.startswith("the module")]
    # a file that exits while it runs is an error naming it, not the end of nslib
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(ValueError, match=r"exits\.py: the file called sys\.exit\(3\)"):
        predict_model("V100", str(exits), predictor="roofline", settings=s)


def test_a_campaign_without_level1_timings_is_named(tmp_path, data_dir):
    root, camp = fake_root(tmp_path)
    (camp / "level3").mkdir(parents=True)
    (camp / "level3" / "1_TinyCNN.py").write_text(LEVEL3["1_TinyCNN.py"])
    (camp / kb.TIMING_FILE).write_text(json.dumps(
        {"level3": {"1_TinyCNN.py": {"mean": 0.2, "hardware": "Fake GPU 9"}}}))
    with pytest.raises(ValueError, match=f"campaign.*{camp.name}: no priced level-1 problem"):
        km.evaluate(["roofline"], root=root, level=3, settings=Settings(progress=False))


def test_cli_predict_module(tmp_path, data_dir, capsys):
    path = _net_file(tmp_path)
    assert main(["predict", "--gpu", "V100", "--module", f"{path}:Net", "--inputs",
                 "2x3x32x32", "--predictor", "roofline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_kernels"] == 5 and out["e2e_ms"] > 0 and out["mode"] == "inf"
    assert main(["predict", "--gpu", "V100", "--module", f"{path}:Net", "--inputs",
                 "2x3x32x32", "--predictor", "roofline"]) == 0
    text = capsys.readouterr().out
    assert "inference forward on" in text and "5 kernels" in text
    assert main(["predict", "--gpu", "V100", "--module", f"{path}:Net", "--batch", "2"]) == 2
    assert "drop --batch" in capsys.readouterr().err
    assert main(["predict", "--gpu", "V100", "--model", "gpt2_large", "--module",
                 f"{path}:Net"]) == 2
    assert "give one of --model" in capsys.readouterr().err
    assert main(["predict", "--gpu", "V100", "--model", "gpt2_large"]) == 2
    assert "needs --batch" in capsys.readouterr().err


def test_predict_model_leaves_the_callers_module_alone(data_dir):
    from nslib.model.predict import predict_model
    net = nn.Sequential(nn.Linear(8, 4), nn.Dropout(0.1))   # real weights, training mode
    before = net[0].weight.detach().clone()
    _, summ = predict_model("V100", net, predictor="roofline", inputs=[(2, 8)],
                            settings=Settings(progress=False))
    assert summ["n_kernels"] >= 1
    assert net.training and net[0].weight.device.type == "cpu"
    assert torch.equal(net[0].weight.detach(), before)


def test_factory_returning_the_callers_module_leaves_it_alone(data_dir):
    from nslib.model.predict import predict_model
    net = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4))    # real weights and buffers
    before = net[0].weight.detach().clone()
    _, summ = predict_model("V100", lambda: net, predictor="roofline", inputs=[(2, 8)],
                            settings=Settings(progress=False))
    assert summ["n_kernels"] >= 1
    assert net[0].weight.device.type == "cpu" and net[1].running_mean.device.type == "cpu"
    assert torch.equal(net[0].weight.detach(), before)


def test_module_specs_and_inputs_in_every_form(tmp_path, data_dir):
    from nslib.model.module_predict import is_module_spec, module_trace_of
    from nslib.model.predict import predict_model
    path = _net_file(tmp_path)
    # a path object with a factory name is a module, whatever colons the folder holds
    assert is_module_spec(Path(f"{path}:Net")) and is_module_spec(f"{path}:Net")
    assert not is_module_spec("gpt2_large") and not is_module_spec(Path("config.json"))
    colon_dir = tmp_path / "a:b"
    colon_dir.mkdir()
    moved = colon_dir / "mynet.py"
    moved.write_text(path.read_text())
    one = module_trace_of(f"{moved}:Net", inputs=[(2, 3, 32, 32)])
    # one shape, or one tensor, alone is the module's one input
    assert len(module_trace_of(f"{moved}:Net", inputs=(2, 3, 32, 32))) == len(one)
    assert len(module_trace_of(Path(f"{path}:Net"), inputs=torch.randn(2, 3, 32, 32))) == \
        len(one)
    # a wrong shape is told apart from a module that needs real data
    with pytest.raises(ValueError, match=r"inputs \[2x3x16x16\].*check that the input shapes"):
        predict_model("V100", f"{path}:Net", predictor="roofline", inputs=[(2, 3, 16, 16)],
                      settings=Settings(progress=False))
    with pytest.raises(ValueError, match="building the module failed"):
        module_trace_of(lambda: nn.Linear(-1, 2), inputs=[(2, 2)])
    with pytest.raises(ValueError, match="making its inputs failed"):
        module_trace_of(lambda: nn.Linear(2, 2), inputs=[(2, -2)])
    # a malformed name after the file is told, not taken for a model config
    assert is_module_spec(f"{path}:1Net")
    with pytest.raises(ValueError, match="FILE.py:NAME"):
        module_trace_of(f"{path}:1Net", inputs=[(2, 3, 32, 32)])
    # a module a factory built on meta is traced as it is; a lazy one too; a caller's module
    # with a plain tensor attribute keeps it on its device
    assert len(module_trace_of(lambda: nn.LazyLinear(8), inputs=[(2, 4)])) >= 1
    held = _Masked()
    assert len(module_trace_of(held, inputs=[(2, 4)])) >= 1 and held.mask.device.type == "cpu"


def test_unpriced_share_counts_calls_and_warns(data_dir):
    from nslib.model.predict import predict_model

    class Rnn(nn.Module):   # one LSTM call (many kernels) and one op without a mapping
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(8, 8, batch_first=True)

        def forward(self, x):
            return torch.special.i0(self.rnn(x)[0])

    _, summ = predict_model("V100", Rnn, predictor="roofline", inputs=[(2, 16, 8)],
                            settings=Settings(progress=False))
    assert list(summ["unpriced"].values()) == [1]
    assert summ["unpriced_share"] == pytest.approx(0.5)   # 1 of 2 calls, not of ~50 kernels
    assert any(w.startswith("not priced") for w in summ["warnings"])


def test_cli_module_that_is_not_a_python_file(data_dir, capsys):
    assert main(["predict", "--gpu", "V100", "--module", "gpt2_large"]) == 2
    assert "--module takes FILE.py" in capsys.readouterr().err


def test_module_forecast_carries_the_interval(data_dir, monkeypatch, capsys, tmp_path):
    from nslib.model.predict import predict_model
    from nslib.predictors.intervals import Calibration
    cal = Calibration("roofline", 0.8, {"linear": (-0.1, 0.3), "elementwise": (-0.05, 0.05),
                                        "memory": (-0.05, 0.05)})
    monkeypatch.setattr("nslib.model.predict.calibration", lambda *a, **k: cal)
    _, s = predict_model("V100", _cnn, predictor="roofline", inputs=[(2, 3, 32, 32)],
                         settings=Settings(progress=False))
    lo, hi = s["interval_ms"]
    assert lo < s["e2e_ms"] < hi and s["interval_coverage"] == 0.8
    assert main(["predict", "--gpu", "V100", "--module", f"{_net_file(tmp_path)}:Net",
                 "--inputs", "2x3x32x32", "--predictor", "roofline"]) == 0
    assert "(80%: " in capsys.readouterr().out
