"""The 16-bit data layer: datasheets with Bf16FLOPs, dtypes, tidy tables, drop-in GPUs."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from mixed_fixture import SHEETS, gemm_ms, write_gpu, write_mixed

from nslib.data import mixed_data
from nslib.data.gpus import gpu_from_dict
from nslib.data.paths import DataNotFoundError, mixed_root
from nslib.evaluation.kernel_level import resolve_gpus
from nslib.kernels import dtypes
from nslib.predictors.tc_gemm import GEMM
from nslib.predictors.tensor_baselines import Roofline, RooflineEfficiency, roofline_ms


@pytest.fixture
def mixed(tmp_path):
    return write_mixed(tmp_path / "mixed")


def test_dtype_bytes_and_names():
    assert dtypes.bytes_per_elem("fp32") == 4
    assert dtypes.bytes_per_elem("bfloat16") == 2 and dtypes.bytes_per_elem("FP16") == 2
    with pytest.raises(ValueError, match="unknown dtype 'int3'"):
        dtypes.check_dtype("int3")


def test_datasheet_bf16_optional_and_checked():
    sheet = dict(SHEETS["gpu_a"])
    gpu = gpu_from_dict(sheet)
    assert gpu.bf16_peak() == 300000 and gpu.to_json()["Bf16FLOPs"] == 300000
    assert dtypes.matmul_peak_gflops(gpu, "bf16") == 300000
    assert dtypes.matmul_peak_gflops(gpu, "fp32") == 20000
    del sheet["Bf16FLOPs"]
    fp32_only = gpu_from_dict(sheet)
    assert "Bf16FLOPs" not in fp32_only.to_json()
    with pytest.raises(ValueError, match="no 'Bf16FLOPs'"):
        fp32_only.bf16_peak()
    for bad in ("fast", -1, float("nan")):
        with pytest.raises(ValueError, match="Bf16FLOPs"):
            gpu_from_dict({**sheet, "Bf16FLOPs": bad})


def test_mixed_root_setting(tmp_path, monkeypatch, mixed):
    monkeypatch.setenv("NSLIB_MIXED", str(mixed))
    assert mixed_root() == mixed.resolve()
    with pytest.raises(DataNotFoundError, match="NSLIB_MIXED"):
        mixed_root(tmp_path / "nowhere")


def test_gemm_table_newest_version_bf16_only(mixed):
    t = mixed_data.gemm_table(mixed)
    assert sorted(t["gpu"].unique()) == ["Fake GPU A", "Fake GPU B", "Fake GPU C"]
    assert len(t) == 3 * 64  # 4**3 shapes each; fp8 rows and the older version dropped
    a = t[t["gpu"] == "Fake GPU A"]
    np.testing.assert_allclose(a["latency_ms"], gemm_ms(SHEETS["gpu_a"], a["m"], a["n"], a["k"]))
    assert (a["bf16_gflops"] == 300000).all() and (a["mem_bw"] == 2000).all()


def test_attention_table_phases(mixed):
    t = mixed_data.attention_table(mixed)
    dec = t[t["phase"] == "decode"]
    pre = t[t["phase"] == "prefill"]
    assert (dec["q_len"] == 1).all() and set(dec["kv_len"]) == {128, 2048}  # isl 1 + step
    assert (pre["q_len"] == pre["kv_len"]).all() and pre["causal"].all()
    assert len(t) == 3 * 16  # the fp8 KV-cache rows are dropped


def test_layer_table_maps_vidur_folder_to_datasheet(mixed):
    t = mixed_data.layer_table(mixed)
    assert set(t["gpu"]) == {"Fake GPU A"}
    assert set(t["op"]) == {"input_layernorm", "attn_pre_proj"}
    assert t.loc[(t["op"] == "attn_pre_proj") & (t["num_tokens"] == 512), "latency_ms"].item() == 0.3


def test_dropped_in_gpu_joins_every_table(tmp_path):
    root = write_mixed(tmp_path / "m", gpus=("gpu_a", "gpu_b"))
    assert "Fake GPU C" not in set(mixed_data.gemm_table(root)["gpu"])
    write_gpu(root, "gpu_c", SHEETS["gpu_c"])
    mixed_data._gemm.cache_clear()
    mixed_data._attention.cache_clear()
    assert "Fake GPU C" in set(mixed_data.gemm_table(root)["gpu"])
    assert "Fake GPU C" in set(mixed_data.attention_table(root)["gpu"])


def test_table_without_datasheet_is_a_clear_error(tmp_path):
    root = write_mixed(tmp_path / "m", gpus=("gpu_a",))
    (root / "device_configs" / "gpu_a.json").unlink()
    write_gpu(root, "gpu_b", SHEETS["gpu_b"], tables=False)
    with pytest.raises(DataNotFoundError, match="no datasheet whose 'Device' is that name"):
        mixed_data.gemm_table(root)


def test_resolve_gpus_by_name_stem_alias(mixed):
    t = mixed_data.gemm_table(mixed)
    got = resolve_gpus(t, ["Fake_GPU_B", "fake gpu a", "C"], mixed)
    assert got == ["Fake GPU B", "Fake GPU A",
                                                                    "Fake GPU C"]
    with pytest.raises(ValueError, match="ambiguous"):
        resolve_gpus(t, ["fake"], mixed)
    with pytest.raises(ValueError, match="not measured"):
        resolve_gpus(t, ["Fake GPU Z"], mixed)


def test_roofline_and_fitted_efficiency_by_hand(mixed):
    t = mixed_data.gemm_table(mixed)
    big = t[(t["m"] == 4096) & (t["n"] == 4096) & (t["k"] == 4096)]
    a = big[big["gpu"] == "Fake GPU A"]
    # 2 * 4096**3 FLOP at 300 TFLOP/s = 0.458 ms (compute-bound: 100 MB at 2 TB/s is 0.05 ms)
    assert roofline_ms(GEMM, a)[0] == pytest.approx(2 * 4096 ** 3 / 300e12 * 1e3)
    assert Roofline(GEMM).predict(a)[0] == pytest.approx(roofline_ms(GEMM, a)[0])
    # big GEMMs follow roof / 0.7 (+5 us): the fitted efficiency recovers about 0.7
    eff = RooflineEfficiency(GEMM).fit(big)
    assert eff.efficiency == pytest.approx(0.7, rel=0.05)


def test_roofline_needs_bf16_peak(mixed):
    t = mixed_data.gemm_table(mixed).head(3).assign(bf16_gflops=np.nan)
    with pytest.raises(ValueError, match="Bf16FLOPs"):
        roofline_ms(GEMM, t)


def test_tensor_ranges_come_from_the_measured_gpus(tmp_path, monkeypatch):
    from nslib.predictors.gpu_range import range_warnings, tensor_ranges
    root = write_mixed(tmp_path / "m", gpus=("gpu_a", "gpu_b"))
    write_gpu(root, "gpu_c", SHEETS["gpu_c"], tables=False)  # a datasheet-only GPU
    r = tensor_ranges(root)
    assert r["train_gpus"] == ["Fake GPU A", "Fake GPU B"]
    assert r["ranges"]["Bf16FLOPs"] == [300000, 360000]
    c = gpu_from_dict(SHEETS["gpu_c"])
    lines = range_warnings(c, ranges=r)
    assert any("Bf16FLOPs 990,000 GFLOP/s is 2.8x the largest 16-bit training GPU's" in x
               for x in lines)


def test_attention_without_a_flash_build_keeps_its_main_kernel(tmp_path):
    root = write_mixed(tmp_path / "m", gpus=("gpu_a",))
    folder = root / "aiconfigurator/aic-core/src/aiconfigurator_core/systems/data/gpu_a"
    for path in folder.glob("attention/*/*/*.parquet"):
        t = pd.read_parquet(path)
        t.assign(kernel_source="vllm_flashinfer_fiprefill").to_parquet(path)
    t = mixed_data.attention_table(root)
    assert len(t) == 16 and set(t["kernel_source"]) == {"vllm_flashinfer_fiprefill"}
