"""Every notebook runs under papermill in quick mode on the real data and writes its files."""
import pandas as pd
import pytest
from conftest import run_notebook


def test_01_kernel_data(data_dir, tmp_path):
    run_notebook("01_kernel_data", tmp_path, quick=True)
    for name in ("01_latency_vs_size", "01_gemm_roofline", "01_roofline_error_heatmap"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
        assert (tmp_path / f"{name}.pdf").exists()
    tab = pd.read_csv(tmp_path / "01_roofline_error.csv", index_col=0)
    assert 35 < tab.loc["bmm", "train_gpus"] < 45
    assert set(tab.index) == {"bmm", "linear", "elementwise", "softmax", "layernorm"}


def test_02_kernel_predictors(data_dir, tmp_path):
    run_notebook("02_kernel_predictors", tmp_path, quick=True)
    tab = pd.read_csv(tmp_path / "02_kernel_error_by_class.csv", index_col=0, header=[0, 1])
    # the quick nslib design beats the roofline on every class, on both GPU groups
    for group in ("train_gpus", "new_gpus"):
        ns, roof = tab[("nslib", group)], tab[("roofline", group)]
        ok = ns.isna() | (ns < roof)
        assert ok.all(), (group, ns.to_dict(), roof.to_dict())
    for name in ("02_pred_vs_measured", "02_error_vs_waves", "02_utilisation_curves",
                 "02_training_curves"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    agree = pd.read_csv(tmp_path / "02_tile_lookup_agreement.csv", index_col=0)
    assert ((agree >= 0) & (agree <= 100) | agree.isna()).all().all()
    # leave-one-GPU-out beside the paper's protocol, and the property checks
    logo = pd.read_csv(tmp_path / "02_logo_nslib.csv", index_col=0)
    assert {"mean (training GPUs held out)", "worst held-out GPU"} <= set(logo.columns)
    assert (logo["worst held-out GPU"] >= logo["mean (training GPUs held out)"]).all()
    assert (tmp_path / "02_logo_nslib.png").stat().st_size > 1000
    props = pd.read_csv(tmp_path / "02_property_checks.csv", index_col=[0, 1])
    assert (props["kernels checked"] > 0).all()


def test_03_baselines(data_dir, tmp_path):
    run_notebook("03_baselines", tmp_path, quick=True)
    tab = pd.read_csv(tmp_path / "03_baselines_kernel_error.csv", index_col=0, header=[0, 1])
    assert {"roofline", "habitat", "li", "linreg", "xgboost", "mlp", "nslib"} <= set(tab.index)
    assert (tmp_path / "03_baselines_error_boxes.png").exists()
    logo = pd.read_csv(tmp_path / "03_baselines_logo.csv", index_col=0, header=[0, 1])
    assert {"roofline", "nslib"} <= set(logo.index)


@pytest.mark.parametrize("name,mode", [("04_inference", "inf"), ("05_training", "train")])
def test_04_05_model_tables(data_dir, tmp_path, name, mode):
    extra = {"kernelbench_levels": []} if name == "04_inference" else {}  # tested next
    run_notebook(name, tmp_path, quick=True, predictors=["nslib", "roofline"], **extra)
    prefix = name[:2]
    res = pd.read_csv(tmp_path / f"{prefix}_{mode}_results.csv")
    assert set(res["predictor"]) == {"nslib", "roofline"}
    assert (res["pred_ms"] > 0).all() and (res["e2e_ms"] > 0).all()
    summary = pd.read_csv(tmp_path / f"{prefix}_{mode}_summary.csv", index_col=0)
    assert "all" in summary.columns
    assert (tmp_path / f"{prefix}_{mode}_per_class_error.csv").exists()
    by_gpu = pd.read_csv(tmp_path / f"{prefix}_{mode}_per_class_by_gpu.csv", index_col=0)
    assert {"linear", "bmm"} <= set(by_gpu.index) and len(by_gpu.columns) >= 1
    assert (tmp_path / f"{prefix}_{mode}_breakdown.png").exists()
    agg = pd.read_csv(tmp_path / f"{prefix}_{mode}_aggregation.csv", index_col=[0, 1])
    assert set(agg.index.get_level_values(1)) == {"stream", "plain sum"}
    assert agg.loc[("nslib", "stream"), "all"] == pytest.approx(res.loc[
        res["predictor"] == "nslib", "err"].mean())
    # leave-one-GPU-out beside the paper's protocol, on the training GPUs' labels
    logo = pd.read_csv(tmp_path / f"{prefix}_{mode}_logo.csv", index_col=0)
    rows = {f"{p} ({proto})" for p in ("nslib", "roofline")
            for proto in ("paper protocol", "leave-one-GPU-out")}
    assert set(logo.index) == rows and "worst held-out GPU" in logo.columns
    paper = res[res["gpu"].isin(logo.columns)].groupby(["predictor", "gpu"])["err"].mean()
    for gpu in logo.columns[:-2]:
        assert logo.loc["nslib (paper protocol)", gpu] == pytest.approx(paper["nslib", gpu])
        # the roofline is not trained: both protocols agree
        assert logo.loc["roofline (leave-one-GPU-out)", gpu] == pytest.approx(
            paper["roofline", gpu])
    assert (tmp_path / f"{prefix}_{mode}_logo.png").stat().st_size > 1000
    per_class = pd.read_csv(tmp_path / f"{prefix}_{mode}_logo_per_class_by_gpu.csv", index_col=0)
    gpus = [c for c in per_class.columns if c in logo.columns[:-2]]
    assert gpus and per_class["mean (training GPUs held out)"].round(6).equals(
        per_class[gpus].mean(axis=1).round(6))
    if name == "04_inference":   # two modules written in the notebook, on every datasheet
        own = pd.read_csv(tmp_path / "04_own_modules.csv")
        assert own["module"].nunique() == 2 and (own["ms"] > 0).all()
        assert own.groupby("module")["gpu"].nunique().min() >= 5
        # a training step is the inference forward and a backward
        wide = own.pivot_table(index=["module", "gpu"], columns="mode", values="ms")
        assert (wide["train"] > wide["inf"]).all()
        assert (own.loc[own["mode"] == "inf", "backward ms"] == 0).all()
        assert (tmp_path / "04_own_modules.png").exists()
        tf32 = tmp_path / "04_own_tf32.csv"   # written where the 16-bit datasheets are there
        if tf32.exists():
            tf32 = pd.read_csv(tf32)
            # allowing TF32 never makes a step slower
            assert len(tf32) and (tf32["TF32 allowed ms"] <= tf32["FP32 ms"] * (1 + 1e-9)).all()
            wide = tf32[tf32["module"].str.startswith("VGG")]
            assert (wide["TF32 kernels"] > 0).all() and (wide["speed-up"] > 1).all()


def test_09_mixed_precision(data_dir, mixed_dir, tmp_path):
    run_notebook("09_mixed_precision", tmp_path, quick=True,
                 forecast_steps=[["inf", 1, 256]])
    for kind in ("gemm", "attention"):
        tab = pd.read_csv(tmp_path / f"09_{kind}_logo.csv", index_col=0)
        # every measured GPU is a column; the bounded predictor beats the plain roofline and
        # the one-efficiency roofline on each GPU it never saw, even in the quick profile
        assert tab.shape[1] >= 2
        assert (tab.loc["nslib"] < tab.loc["roofline"]).all()
        assert (tab.loc["nslib"] < tab.loc["roofline_eff"]).all()
    layers = pd.read_csv(tmp_path / "09_layer_check.csv", index_col=0)
    assert {"layer", "gemm", "norm", "n"} <= set(layers.columns) and (layers["n"] > 0).all()
    agree = pd.read_csv(tmp_path / "09_source_agreement.csv", index_col=0)
    assert (agree["shapes"] > 0).all() and agree["median"].between(0.5, 2).all()
    fc = pd.read_csv(tmp_path / "09_forecast_llama3_8b.csv")
    assert fc["datasheet only"].any() and (fc["ms"] > 0).all()
    # a GPU with more tensor-core peak and bandwidth is forecast faster
    sheets = pd.read_csv(tmp_path / "09_datasheets.csv", index_col=0)
    fast = fc.set_index("gpu")["ms"].reindex(sheets.index).dropna()
    top = sheets.loc[fast.index, "bf16_gflops"].idxmax()
    assert fast[top] == fast.min()


def test_04_kernelbench_section(data_dir, kernelbench_dir, tmp_path):
    """The any-module section of notebook 04 on KernelBench's level-3 problems: per GPU and
    family tables, the unpriced list, both figures."""
    run_notebook("04_inference", tmp_path, quick=True, predictors=["roofline"],
                 kernelbench_levels=[3])
    per_gpu = pd.read_csv(tmp_path / "04_kernelbench_level3.csv", index_col=0)
    assert (per_gpu["n_priced"] <= per_gpu["n_total"]).all() and per_gpu["n_priced"].sum() > 0
    assert (per_gpu[["nslib", "roofline"]] >= 0).all().all()
    fam = pd.read_csv(tmp_path / "04_kernelbench_level3_families.csv", index_col=0)
    assert {"cnn", "recurrent"} <= set(fam.index)
    for name in ("04_kernelbench_level3", "04_kernelbench_level3_scatter"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
