"""Notebook 11 (the paper side by side) runs under papermill in quick mode on the real data and
puts every configuration the paper reports beside its reproduction."""
import pandas as pd
from conftest import run_notebook

from nslib.data import paper_results


def test_11_paper_side_by_side(data_dir, tmp_path):
    run_notebook("11_paper_side_by_side", tmp_path, quick=True,
                 predictors=["neusight", "nslib", "roofline"], models=["bert_large"])
    side = pd.read_csv(tmp_path / "11_configs.csv", keep_default_na=False,
                       na_values=[""]).fillna({"variant": ""})
    reported = paper_results.reported_configs()
    reported = reported[reported["model"] == "bert_large"]
    # every configuration the paper reports for the model is in the table, reproduced
    got = side[side["method"] == "neusight"]
    assert len(got) == len(reported[reported["method"] == "neusight"])
    assert got["reproduced_err"].notna().all() and got["reported_err"].notna().all()
    # the label in the data is the one the paper scored against
    assert ((got["label_ms"] - got["measured_ms"]).abs() < 1e-3 * got["measured_ms"]).all()
    head = pd.read_csv(tmp_path / "11_reported_vs_reproduced.csv", index_col=0)
    assert {"paper NeuSight", "NeuSight reproduced", "nslib", "Roofline reported",
            "Roofline reproduced"} <= set(head.columns)
    assert (head["configs"] >= 1).all()
    cells = pd.read_csv(tmp_path / "11_agreement.csv", index_col=[0, 1])
    assert set(cells["agrees"]) <= {0, 1} and len(cells) == len(head)
    for name in ("11_inf_bars", "11_train_bars"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    per_class = pd.read_csv(tmp_path / "11_per_class.csv", index_col=[0, 1], header=[0, 1])
    assert ("neusight", "reported") in per_class.columns
    assert ("nslib", "reproduced") in per_class.columns
    fusion = pd.read_csv(tmp_path / "11_fusion.csv", index_col=[0, 1, 2, 3], header=[0, 1])
    assert len(fusion) >= 2 and fusion[("reproduced_err", "neusight")].notna().all()
