"""A PyTorch module's training step (issue: forecast any PyTorch model): the kernels the
backward launches, checked by hand for an MLP, a small CNN and cuDNN's recurrent backward; the
step priced forward and backward from the library and the command line."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

from nslib.cli import main
from nslib.data.settings import Settings
from nslib.model.module_trace import ProblemError, trace_module
from nslib.model.step import Step


def _meta(build, *shape):
    with torch.device("meta"):
        return build(), torch.randn(*shape)


def test_softmax_backwards_by_hand():
    """Softmax's backward: CUDA's product kernel, then the row kernel; log-softmax's: the row
    kernel alone (it takes the output's exp, one more FLOP per element)."""
    for fn, ops, flops in ((nn.Softmax(-1), ["mul", "softmax_bw"], [1, 3]),
                           (nn.LogSoftmax(-1), ["logsoftmax_bw"], [4])):
        model, x = _meta(lambda: nn.Sequential(nn.Linear(16, 32), fn), 6, 16)
        bw = trace_module(model, [x], mode="train").query("phase == 'bw'")
        rows = bw[bw["aten"].str.contains("softmax_backward")]
        assert rows["op"].tolist() == ops and (rows[["B", "H"]].to_numpy() == [6, 32]).all()
        assert (rows["flops"] / (6 * 32)).tolist() == flops


def test_mlp_backward_by_hand():
    model, x = _meta(lambda: nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)), 3, 8)
    tr = trace_module(model, [x], mode="train")
    assert tr["phase"].tolist() == ["fw"] * 4 + ["bw"] * 7
    # forward: two GEMMs, the ReLU and the loss's sum; backward from a ones gradient
    assert tr["op"].tolist() == ["linear", "relu", "linear", "mem",
                                 "mem", "linear", "linear", "mem", "mul", "linear", "mem"]
    gemms = tr[tr["cls"] == "linear"][["M", "N", "K"]].astype(int).values.tolist()
    assert gemms == [[3, 8, 4], [3, 4, 2],
                     [3, 2, 4],    # dX of the second layer: (3 x 2) @ (2 x 4)
                     [2, 3, 4],    # its dW: (2 x 3) @ (3 x 4)
                     [4, 3, 8]]    # the first layer's dW; its input is data, no dX
    # the backward GEMMs belong to the forward call whose gradient they compute
    assert tr["call"].iloc[5] == tr["call"].iloc[6] == tr["call"].iloc[2]
    # accumulating into existing gradients adds one add per parameter
    acc = trace_module(model, [x], mode="train", grad_accumulation=True)
    assert len(acc) - len(tr) == 4 and (acc["aten"] == "aten.add_.Tensor").sum() == 4


def test_cnn_backward_has_no_unpriced_op():
    model, x = _meta(lambda: nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                                           nn.MaxPool2d(2)), 2, 3, 10, 10)
    tr = trace_module(model, [x], mode="train")
    assert tr.attrs["unknown_ops"] == {}
    bw = tr[tr["phase"] == "bw"]
    pool = bw[bw["aten"].str.contains("max_pool2d_with_indices_backward")].iloc[0]
    # reads the 2x8x4x4 output gradient and its int64 indices, writes the 2x8x8x8 input's
    assert pool["bytes"] == 4 * 256 + 8 * 256 + 4 * 1024
    # batch statistics: the per-channel reduction, then the elementwise pass
    bn = bw[bw["aten"].str.contains("native_batch_norm_backward")]
    assert bn["op"].tolist() == ["add", "add"] and (bn["B"] * bn["H"] == 2 * 8 * 64).all()
    conv = bw[bw["aten"].str.contains("convolution_backward")]
    # the weight gradient GEMM and the bias reduction; the image needs no gradient
    assert conv["cls"].tolist() == ["linear", "memory"]
    assert conv.iloc[0][["M", "N", "K"]].astype(int).tolist() == [8, 2 * 64, 27]


def test_lstm_backward_is_cudnns():
    T, B, H, layers = 5, 4, 32, 2
    model, x = _meta(lambda: nn.LSTM(16, H, num_layers=layers, batch_first=True), B, T, 16)
    tr = trace_module(model, [x], mode="train")
    assert tr.attrs["unknown_ops"] == {}
    bw = tr[tr["aten"] == "cudnn_rnn_backward.LSTM"]
    # per layer, per step a pointwise kernel and the recurrent data-gradient GEMM; then the
    # input projection's data gradient (not the first layer's: its input is data) and the
    # two weight-gradient GEMMs over every step
    assert (bw["cls"] == "elementwise").sum() == layers * T
    assert (bw["cls"] == "linear").sum() == layers * T + (layers - 1) + 2 * layers
    step = bw[bw["cls"] == "linear"].iloc[0]
    assert step[["M", "N", "K"]].astype(int).tolist() == [B, 4 * H, H]
    dw = bw[bw["cls"] == "linear"].iloc[-2:][["M", "N", "K"]].astype(int).values.tolist()
    assert dw == [[16, T * B, 4 * H], [H, T * B, 4 * H]]
    # one operator call: the forward's, launched by cuDNN from C++
    fw_call = tr[tr["aten"] == "cudnn_rnn.LSTM"]["call"].unique()
    assert bw["call"].unique().tolist() == fw_call.tolist()
    # accumulated gradients: one add per parameter, filed under the layer's call
    acc = trace_module(model, [x], mode="train", grad_accumulation=True)
    adds = acc[acc["aten"] == "aten.add_.Tensor"]
    assert len(adds) == len(list(model.parameters())) and (adds["call"] == fw_call[0]).all()
    # no autograd of PyTorch's own step-by-step decomposition
    assert set(tr[tr["phase"] == "bw"]["aten"]) == {"cudnn_rnn_backward.LSTM",
                                                   "aten.ones_like.default"}


def test_gru_bidirectional_time_major_backward():
    T, B, H, layers = 5, 4, 32, 2
    model, x = _meta(lambda: nn.GRU(16, H, num_layers=layers, bidirectional=True), T, B, 16)
    tr = trace_module(model, [x], mode="train")
    bw = tr[tr["aten"] == "cudnn_rnn_backward.GRU"]
    assert (bw["cls"] == "elementwise").sum() == layers * 2 * T
    # per layer and direction T recurrent GEMMs and two weight GEMMs; the second layer's two
    # directions also take the data gradient of their 2H-wide input
    assert (bw["cls"] == "linear").sum() == layers * 2 * (T + 2) + 2
    gemms = bw[bw["cls"] == "linear"][["M", "N", "K"]].astype(int).values.tolist()
    assert [B, 3 * H, H] in gemms and [T * B, 3 * H, 2 * H] in gemms
    assert [16, T * B, 3 * H] in gemms and [2 * H, T * B, 3 * H] in gemms


class _FrozenEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn, self.head = nn.LSTM(8, 8, batch_first=True), nn.Linear(8, 2)
        for prm in self.rnn.parameters():
            prm.requires_grad_(False)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


class _EncoderDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.dec = nn.LSTM(8, 8, batch_first=True), nn.LSTM(8, 8, batch_first=True)

    def forward(self, x):
        _, state = self.enc(x)
        return self.dec(x, state)[0]


def test_frozen_and_stacked_recurrent_layers():
    model, x = _meta(_FrozenEncoder, 2, 3, 8)
    tr = trace_module(model, [x], mode="train")
    # the frozen layer has nothing to compute backwards; the head its weight gradients only
    assert not tr["aten"].str.startswith("cudnn_rnn_backward").any()
    assert sorted(tr.loc[tr["phase"] == "bw", "cls"]) == ["linear", "memory", "memory"]
    # the decoder's initial state is the encoder's output: both layers run backwards
    model, x = _meta(_EncoderDecoder, 2, 3, 8)
    bw = trace_module(model, [x], mode="train")
    bw = bw[bw["aten"] == "cudnn_rnn_backward.LSTM"]
    assert bw["call"].nunique() == 2 and len(bw) == 2 * (3 + 3 + 2)


def test_training_trace_leaves_the_module_as_it_was():
    model, x = _meta(lambda: nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), 3, 4)
    model.eval()
    first = trace_module(model, [x], mode="train")
    again = trace_module(model, [x], mode="train")
    assert len(first) == len(again)           # no gradient left behind to accumulate into
    assert not model.training and not model[1].training
    assert all(q.grad is None for q in model.parameters())
    with pytest.raises(ProblemError, match="packed sequence"):
        from torch.nn.utils.rnn import pack_padded_sequence
        with torch.device("meta"):
            rnn = nn.LSTM(4, 4)
        trace_module(rnn, [pack_padded_sequence(torch.randn(3, 2, 4), torch.tensor([3, 2]))])


class _InPlaceAfterRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = torch.relu(self.lin(x))
        y += 1.0                    # ReLU's backward needs its output: PyTorch refuses
        return y


def test_a_module_pytorch_cannot_train_is_a_clear_error():
    from nslib.model.module_predict import module_trace_of
    with pytest.raises(ProblemError, match="backward failed.*cannot train this module"):
        module_trace_of(_InPlaceAfterRelu, inputs=[(2, 4)], mode="train")
    assert len(module_trace_of(_InPlaceAfterRelu, inputs=[(2, 4)])) == 3


def test_training_a_module_without_parameters_is_a_clear_error():
    model, x = _meta(nn.ReLU, 2, 2)
    with pytest.raises(ProblemError, match="nothing to train"):
        trace_module(model, [x], mode="train")


def test_predict_a_modules_training_step(data_dir):
    from nslib.model.predict import predict_model

    def net():
        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                             nn.Linear(8 * 30 * 30, 10))

    s = Settings(progress=False)
    _, inf = predict_model("V100", net, predictor="roofline", inputs=[(4, 3, 32, 32)],
                           settings=s)
    frame, train = predict_model("V100", net, Step(1, 1, "train"), "roofline",
                                 inputs=[(4, 3, 32, 32)], settings=s)
    assert inf["bw_ms"] == 0 and train["bw_ms"] > 0
    assert train["e2e_ms"] == pytest.approx(train["fw_ms"] + train["bw_ms"])
    assert train["e2e_ms"] == pytest.approx(frame["pred_ms"].sum())
    assert train["fw_ms"] >= inf["fw_ms"] * 0.99 and train["e2e_ms"] > 1.5 * inf["e2e_ms"]


def test_cli_predict_module_training(tmp_path, data_dir, capsys):
    path = tmp_path / "mlp.py"
    path.write_text("import torch.nn as nn\n"
                    "def Net():\n    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), "
                    "nn.Linear(64, 8))\n")
    assert main(["predict", "--gpu", "V100", "--module", f"{path}:Net", "--inputs", "32x64",
                 "--mode", "train", "--predictor", "roofline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "train" and out["bw_ms"] > 0
    # memory: the weights (2 x 64 x 64 + ... FP32) and as much again in gradients, the Adam
    # states twice that
    mem = out["memory_gb"]
    n_params = 64 * 64 + 64 + 64 * 8 + 8
    assert mem["weights"] * 2**30 == pytest.approx(4 * n_params)
    assert mem["grads"] == pytest.approx(mem["weights"])
    assert mem["optimizer"] >= 2 * mem["weights"] and out["fits"]
    assert main(["predict", "--gpu", "V100", "--module", f"{path}:Net", "--inputs", "32x64",
                 "--mode", "train", "--predictor", "roofline"]) == 0
    text = capsys.readouterr().out
    assert "training step (forward + backward, no optimizer" in text and "memory: fits" in text
    assert main(["predict", "--gpu", "V100", "--module", f"{path}:Net", "--inputs", "32x64",
                 "--dtype", "bf16"]) == 2
    assert "drop --dtype" in capsys.readouterr().err


def test_kernelbench_level3_models_trace_a_training_step(kernelbench_dir):
    """Every level-3 model of one campaign traces a training step on the meta device (no
    unmapped op), Swin's two included (their constructors read tensor values: built with
    their small tensors on the CPU, then moved to meta), but the two PyTorch itself cannot:
    ShuffleNet's (an in-place op on a tensor its backward needs, refused by autograd as on a
    real GPU)."""
    import glob
    from pathlib import Path

    from nslib.model.module_trace import load_problem, meta_trace
    files = sorted(glob.glob(str(kernelbench_dir / "*" / "level3" / "*.py")))
    campaign = Path(files[0]).parent.parent
    failed, unknown = {}, {}
    for path in sorted(campaign.glob("level3/*.py")):
        ns = load_problem(path)
        try:
            tr = meta_trace(lambda: ns["Model"](*ns["get_init_inputs"]()), ns["get_inputs"],
                            path.name, eval_mode=False, mode="train")
            unknown.update(tr.attrs["unknown_ops"])
        except ProblemError as e:
            failed[path.name] = str(e)
    assert unknown == {}
    assert all("backward failed" in why for name, why in failed.items() if "Shuffle" in name)
    assert {n for n in failed if "Shuffle" not in n} == set()
    assert len(failed) == 2


@pytest.mark.parametrize("cls,kw", [(nn.LSTM, dict(batch_first=True, num_layers=2)),
                                    (nn.LSTM, dict(proj_size=8, bidirectional=True)),
                                    (nn.GRU, dict(bidirectional=True, num_layers=3)),
                                    (nn.RNN, dict(batch_first=True, bidirectional=True))])
def test_recurrent_layer_shapes_without_the_decomposition(cls, kw):
    """While traced, a recurrent layer returns outputs of the shapes PyTorch's own forward
    gives (without running its step-by-step decomposition), and is itself again afterwards."""
    from nslib.model.rnn_trace import _ShapesOnly

    with torch.device("meta"):
        rnn = cls(16, 24, **kw)
        x = torch.empty(5, 7, 16)
    real = rnn(x)
    handle = _ShapesOnly(rnn)
    fast = rnn(x)
    handle.remove()
    flat = lambda o: [o[0], *(o[1] if isinstance(o[1], tuple) else (o[1],))]
    assert [t.shape for t in flat(fast)] == [t.shape for t in flat(real)]
    assert "forward" not in rnn.__dict__
    assert [t.shape for t in flat(rnn(x))] == [t.shape for t in flat(real)]


def test_projected_lstm_by_hand():
    """An LSTM with ``proj_size`` P: per step the recurrent GEMM is P deep and the new hidden
    state is projected (H -> P); the backward takes the projection's data gradient first and
    adds its weight gradient."""
    T, B, H, P = 3, 4, 32, 8
    model, x = _meta(lambda: nn.LSTM(16, H, proj_size=P, batch_first=True), B, T, 16)
    tr = trace_module(model, [x], mode="train")
    assert tr.attrs["unknown_ops"] == {}
    gemm = lambda f: f[f["cls"] == "linear"][["M", "N", "K"]].astype(int).values.tolist()
    fw = tr[tr["aten"] == "cudnn_rnn.LSTM"]
    assert gemm(fw) == [[T * B, 16, 4 * H]] + [[B, P, 4 * H], [B, H, P]] * T
    assert (fw["cls"] == "elementwise").sum() == T
    bw = tr[tr["aten"] == "cudnn_rnn_backward.LSTM"]
    assert gemm(bw) == [[B, P, H], [B, 4 * H, P]] * T + [[16, T * B, 4 * H],
                                                         [P, T * B, 4 * H], [H, T * B, P]]


class _CellLoop(nn.Module):
    """An LSTM cell feeding a GRU cell, stepped by the module's own loop."""

    def __init__(self, n_in=16, h=32):
        super().__init__()
        self.h = h
        self.lstm, self.gru = nn.LSTMCell(n_in, h), nn.GRUCell(h, h)

    def forward(self, x):
        h = c = g = x.new_zeros(x.shape[0], self.h)
        for t in range(x.shape[1]):
            h, c = self.lstm(x[:, t], (h, c))
            g = self.gru(h, g)
        return g


def test_recurrent_cells_are_cudas_fused_kernels():
    """Each step of an LSTM or GRU cell: its two GEMMs and one fused pointwise kernel, not the
    dozen pointwise kernels of PyTorch's decomposition; the backward one fused kernel and the
    GEMMs of the gradients that are needed (the LSTM's input is data: no input gradient)."""
    T, B, H = 3, 4, 32
    model, x = _meta(_CellLoop, B, T, 16)
    tr = trace_module(model, [x], mode="train")
    assert tr.attrs["unknown_ops"] == {}
    gemm = lambda f: f[f["cls"] == "linear"][["M", "N", "K"]].astype(int).values.tolist()
    lstm = tr[tr["aten"] == "_thnn_fused_lstm_cell"]
    assert gemm(lstm) == [[B, 16, 4 * H], [B, H, 4 * H]] * T
    assert lstm.groupby("call")["cls"].apply(list).tolist() == \
        [["linear", "linear", "elementwise"]] * T
    gru = tr[tr["aten"] == "_thnn_fused_gru_cell"]
    assert gemm(gru) == [[B, H, 3 * H], [B, H, 3 * H]] * T
    assert (gru["cls"] == "elementwise").sum() == T
    lstm_bw = tr[tr["aten"] == "_thnn_fused_lstm_cell_backward"]
    # last step first: the state's data gradient (not the first step's: its state is the
    # zeros the loop made) and the two weight gradients
    weights = [[16, B, 4 * H], [H, B, 4 * H]]
    assert gemm(lstm_bw) == ([[B, 4 * H, H]] + weights) * (T - 1) + weights
    gru_bw = tr[tr["aten"] == "_thnn_fused_gru_cell_backward"]
    weights = [[H, B, 3 * H], [H, B, 3 * H]]
    assert gemm(gru_bw) == ([[B, 3 * H, H]] * 2 + weights) * (T - 1) + [[B, 3 * H, H]] + weights
    assert (gru_bw["cls"] == "elementwise").sum() == (lstm_bw["cls"] == "elementwise").sum() == T
    # inference: no decomposition left either
    inf = trace_module(model, [x], mode="inf")
    assert set(inf["aten"]) <= {"_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
                                "aten.new_zeros.default", "aten.select.int", "aten.zeros.default"}


def test_packing_inside_the_forward_is_the_packed_sequence_error(tmp_path, capsys):
    """A module that packs its own batch fails where the lengths meet the meta device; the
    error says what to give instead, not that the module reads data."""
    f = tmp_path / "packed.py"
    f.write_text("import torch\nfrom torch import nn\n"
                 "from torch.nn.utils.rnn import pack_padded_sequence\n\n"
                 "class Net(nn.Module):\n"
                 "    def __init__(self):\n"
                 "        super().__init__()\n"
                 "        self.lstm = nn.LSTM(8, 16, batch_first=True)\n\n"
                 "    def forward(self, x):\n"
                 "        n = torch.full((x.shape[0],), x.shape[1], dtype=torch.long)\n"
                 "        return self.lstm(pack_padded_sequence(x, n, batch_first=True))[0]\n")
    assert main(["predict", "--gpu", "V100", "--module", f"{f}:Net", "--inputs", "2x5x8",
                 "--predictor", "roofline"]) == 2
    assert "give the recurrent layers the padded batch" in capsys.readouterr().err
