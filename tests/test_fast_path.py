"""The cached prediction path: numpy forward pass equal to torch's, and no torch imported."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nslib.kernels import measured, sizes
from nslib.predictors.features import tile_features
from nslib.predictors.network import make_mlp
from nslib.data.settings import Settings
from nslib.predictors import trained
from nslib.predictors.wave_laws import FORMS, OUTPUTS, wave_context, wave_ms

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "scipy", "matplotlib", "seaborn", "sklearn", "xgboost")
TINY = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100,
        "n_positions": 64}


@pytest.fixture(scope="module")
def shipped(data_dir):
    """The default NeuSight predictor (quick profile), trained and cached."""
    return trained("nslib", Settings(quick=True, progress=False))


def _torch_raw(weights: list, z: np.ndarray) -> np.ndarray:
    """The members' raw outputs through torch's nn.Sequential (float64), side by side."""
    import torch
    outs = []
    for w in weights:
        n_layers = len(w) // 2 - 1
        mlp = make_mlp(w[0].shape[1], n_layers, w[0].shape[0], w[-1].shape[0]).double()
        with torch.no_grad():
            for p, a in zip(mlp.parameters(), w):
                p.copy_(torch.from_numpy(a.astype(float)))
            outs.append(mlp(torch.from_numpy(z)))
    return torch.cat(outs, dim=1)


def test_numpy_forward_equals_torch_forward_for_every_class(shipped):
    import torch
    test = pd.concat([measured.kernel_table(c, "test").sample(200, random_state=1)
                      for c in sizes.CLASSES], ignore_index=True)
    frame = shipped._pack(shipped._nominal(shipped.tiles.fill(test)))
    forms = set()
    for cls in sizes.CLASSES:
        sub = frame[frame["cls"] == cls]
        form = shipped.configs[cls]["form"]
        forms.add(form)
        z = shipped._inputs(cls, tile_features(sub, shipped.configs[cls]["features"]))
        ours = shipped._outputs(cls, sub)
        ref = _torch_raw(shipped.models[cls], z)
        np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-9, atol=1e-12)
        ms = shipped._latency(cls, ours, sub)
        ref_ms = wave_ms(ref, torch.from_numpy(wave_context(sub)), form).numpy() * \
            sub["waves"].to_numpy(float)
        np.testing.assert_allclose(ms, ref_ms, rtol=1e-9)
        assert np.isfinite(ms).all()
    assert forms == {"series", "stream"}  # the shipped laws


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("members", [1, 3])
def test_every_law_is_the_same_in_numpy_and_torch(form, members):
    import torch
    rng = np.random.default_rng(0)
    n, k = 500, OUTPUTS[form]
    raw = rng.normal(0, 3, (n, k * members))
    ctx = np.abs(rng.lognormal(-3, 2, (n, 6)))
    ctx[:, 1] = rng.integers(1, 40, n)  # waves
    ours = wave_ms(raw, ctx, form)
    ref = wave_ms(torch.from_numpy(raw), torch.from_numpy(ctx), form).numpy()
    assert isinstance(ours, np.ndarray)
    np.testing.assert_allclose(ours, ref, rtol=1e-9)


def _run_cli(args: list, env: dict) -> list:
    """Run ``nslib.cli.main(args)`` in a fresh interpreter; the heavy modules it imported."""
    code = ("import sys; from nslib.cli.commands import main; rc = main(sys.argv[1:]); "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {set(HEAVY)!r})); "
            "sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1].replace("'", '"'))


def test_cached_predict_imports_no_torch(shipped, tmp_path):
    spec = tmp_path / "tiny.json"
    spec.write_text(json.dumps(TINY))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["predict", "--gpu", "H100", "--model", str(spec), "--batch", "2", "--seq", "32",
            "--mode", "train", "--quick", "--json"]
    _run_cli(args, env)  # traces the model (torch) and caches the trace
    assert _run_cli(args, env) == []
    # the roofline too
    assert _run_cli(args[:-2] + ["--predictor", "roofline"], env) == []
