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
