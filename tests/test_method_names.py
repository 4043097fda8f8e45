"""No committed table, figure or README headline labels as NeuSight a method that is not the
paper's: `neusight` is the paper's method as published, `nslib` nslib's design."""
from __future__ import annotations

import pandas as pd

from nslib.data.paths import PROJECT_ROOT
from nslib.predictors import available, predictor_class

FIGURES = PROJECT_ROOT / "figures"


def test_descriptions_name_each_method_for_what_it_is():
    desc = available()
    assert desc["neusight"].startswith("NeuSight as published")
    assert "NeuSight" not in desc["nslib"] and "nslib" in desc["nslib"]
    paper, ours = predictor_class("neusight"), predictor_class("nslib")
    assert paper.plain_sum and not paper.library_sizing
    assert not ours.plain_sum and ours.library_sizing


def test_no_figure_is_named_after_neusight_unless_it_is_the_papers():
    # leave-one-GPU-out tables are of nslib's design and the baselines: the paper's method is
    # never retrained per fold, so a `neusight` row there would be a mislabelled design
    for path in FIGURES.glob("*.csv"):
        assert "neusight" not in path.stem, path.name
        if "logo" in path.stem:
            text = path.read_text()
            assert "neusight" not in text, path.name


def test_readme_headline_leads_with_the_paper_side_by_side():
    text = (PROJECT_ROOT / "README.md").read_text()
    head = text.split("<!-- headline:start -->", 1)[1].split("<!-- headline:end -->", 1)[0]
    first = head.index("**", head.index("_Made by"))
    assert "(11_reported_vs_reproduced.csv)" in head[first:first + 600]
    table = pd.read_csv(FIGURES / "11_reported_vs_reproduced.csv", index_col=0)
    assert {"paper NeuSight", "NeuSight reproduced", "nslib"} <= set(table.columns)
