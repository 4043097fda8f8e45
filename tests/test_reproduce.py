"""nslib reproduce: runs notebooks, skips up-to-date ones, reruns on a parameter change,
names a failing notebook, writes the figure index."""
import pytest
import yaml

from nslib.reproduce import NotebookFailed, load_params, run


def _params(tmp_path, seed):
    path = tmp_path / f"params-{seed}.yaml"
    path.write_text(yaml.safe_dump({"common": {"seed": seed},
                                    "profiles": {"quick": {"quick": True}}}))
    return path


def test_skip_rerun_and_index(data_dir, tmp_path):
    kw = dict(quick=True, only=["01_kernel_data"], out=tmp_path / "figs",
              results=tmp_path / "res", progress=False)
    first = run(params_file=_params(tmp_path, 0), **kw)
    assert [r["status"] for r in first] == ["ran"]
    again = run(params_file=_params(tmp_path, 0), **kw)
    assert [r["status"] for r in again] == ["up to date"]
    changed = run(params_file=_params(tmp_path, 1), **kw)
    assert [r["status"] for r in changed] == ["ran"]
    index = (tmp_path / "figs" / "README.md").read_text()
    assert "01_gemm_roofline.png" in index and "01_kernel_data" in index
    assert (tmp_path / "res" / "01_kernel_data.ipynb").exists()


def test_failing_notebook_is_named(data_dir, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"common": {"seed": "not-a-seed"}}))
    with pytest.raises(NotebookFailed, match="01_kernel_data failed in cell"):
        run(quick=True, only=["01_kernel_data"], out=tmp_path / "f", results=tmp_path / "r",
            params_file=bad, progress=False)


def test_every_numbered_notebook_is_planned():
    plan = load_params(quick=True)
    assert {"00_ideas", "01_kernel_data", "02_kernel_predictors", "03_baselines",
            "04_inference", "05_training", "06_fusion", "07_distributed",
            "08_gpu_explorer"} <= set(plan)
    assert all(p["quick"] is True for p in plan.values())


def test_index_keeps_rows_of_notebooks_not_run_here(tmp_path):
    # a fresh checkout that reruns one notebook has no stamp for the others: their rows stay
    from nslib.reproduce import write_index
    figs, res = tmp_path / "figs", tmp_path / "res"
    figs.mkdir()
    res.mkdir()
    for name in ("00_gpus.csv", "04_new.csv"):
        (figs / name).write_text("a\n1\n")
    (figs / "README.md").write_text(
        "| [00_gpus.csv](00_gpus.csv) | 00_ideas | `{\"seed\": 0}` | abc |\n")
    (res / "04_inference.stamp.json").write_text('{"params": {"seed": 0}, "data_hash": "abc"}')
    index = write_index(figs, res, "abc").read_text()
    assert "| [00_gpus.csv](00_gpus.csv) | 00_ideas | `{\"seed\": 0}` | abc |" in index
    assert "| [04_new.csv](04_new.csv) | 04_inference |" in index


def test_measured_gpu_tables_go_between_the_readme_markers(tmp_path):
    # every measured GPU's notebook-14 tables, by file name alone, with counts and means
    from nslib.reproduce import write_measured
    figs = tmp_path / "figs"
    figs.mkdir()
    (figs / "14_fp32_some_gpu.csv").write_text(
        "cls,nslib,roofline,ratio_nslib,n\nlinear,8.66,29.3,1.0,724\nbmm,20.4,44.7,0.9,528\n")
    (figs / "14_tensor_some_gpu.csv").write_text(
        "kind,phase,nslib,xgboost,n\ngemm,gemm,11.37,20.6,1136\n"
        "attention,decode,78.5,81.6,653\n")
    (figs / "14_steps_some_gpu.csv").write_text(
        "tag,dtype,err_nslib,err_roofline\na,fp32,10.0,30.0\nb,fp32,12.0,40.0\n"
        "c,bf16,15.0,20.0\n")
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- measured:start -->\nold\n<!-- measured:end -->\nafter\n")
    write_measured(figs, readme)
    text = readme.read_text()
    assert "old" not in text and text.startswith("intro\n") and text.endswith("after\n")
    assert "`some_gpu`" in text
    assert "| linear (724)" in text and "8.7" in text and "Habitat" not in text
    assert "| GEMM (1,136)" in text and "| attention, decode (653)" in text
    # the steps: the mean error per dtype, n rows each
    assert "| FP32 (2)" in text and "11.0" in text and "35.0" in text and "| BF16 (1)" in text
    plain = tmp_path / "PLAIN.md"
    plain.write_text("no markers\n")
    write_measured(figs, plain)
    assert plain.read_text() == "no markers\n"
    write_measured(tmp_path / "empty", readme)   # no tables: the block stays as it was
    assert "| linear (724)" in readme.read_text()
