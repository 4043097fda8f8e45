"""Property checks of the 16-bit predictors (:mod:`nslib.evaluation.tensor_properties`)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nslib.evaluation.tensor_properties import CHECKS, FACTORS, tensor_property_checks


class _Roofline:
    """A stand-in predictor: FLOP at the BF16 peak plus bytes at the bandwidth (ms)."""

    def predict(self, f):
        return 1e3 * (2 * f.m * f.n * f.k / (f.bf16_gflops * 1e9)
                      + 2 * (f.m * f.k + f.k * f.n + f.m * f.n) / (f.mem_bw * 1e9)).to_numpy()


class _L2Hurts(_Roofline):
    """Slower with more L2 on every row: the check must see it."""

    def predict(self, f):
        return super().predict(f) * f.l2_mb.to_numpy()


def _rows():
    return pd.DataFrame({"m": [1.0, 4096.0], "n": [4096.0, 4096.0], "k": [4096.0, 512.0],
                         "num_sm": 132.0, "bf16_gflops": 989e3, "peak_gflops": 67e3,
                         "mem_bw": 3350.0, "l2_mb": 50.0, "clock_mhz": 1755.0})


def test_checks_by_hand():
    tab = tensor_property_checks(_Roofline(), _rows())
    assert len(tab) == len(CHECKS) * len(FACTORS) and (tab["rows"] == 2).all()
    assert (tab["passing"] == 100).all() and (tab["worst"] == 1).all()
    hurt = tensor_property_checks(_L2Hurts(), _rows()).set_index(["check", "factor"])
    assert hurt.loc[("more L2", 3.0), "passing"] == 0
    assert hurt.loc[("more L2", 3.0), "worst"] == pytest.approx(3.0)
    assert hurt.loc[("more SMs (their peaks and L2)", 1.5), "passing"] < 100
    assert hurt.loc[("more SMs (their peaks, same L2)", 1.5), "passing"] == 100
    assert hurt.loc[("more bandwidth", 1.5), "passing"] == 100
    with pytest.raises(ValueError, match="no rows"):
        tensor_property_checks(_Roofline(), _rows().head(0))


@pytest.fixture(scope="module")
def tables(mixed_dir):
    from nslib.data.mixed_data import attention_table, gemm_table
    pick = lambda t: t.groupby("gpu", group_keys=False).sample(300, random_state=0)  # noqa: E731
    return {"gemm": pick(gemm_table(mixed_dir)).reset_index(drop=True),
            "attention": pick(attention_table(mixed_dir)).reset_index(drop=True)}


@pytest.mark.parametrize("kind", ["gemm", "attention"])
def test_bandwidth_and_clock_never_slow_the_predictors(tables, kind):
    # bandwidth enters only the physical terms, the clock (with the peaks) only the fixed cost
    # in SM cycles and the compute term: both hold on every row by construction
    from nslib.predictors import predictor_class
    pred = predictor_class("nslib", kind)(quick=True).fit(tables[kind], progress=False)
    tab = tensor_property_checks(pred, tables[kind]).set_index("check")
    for check in ("more bandwidth", "faster clock (the peaks with it)"):
        assert (tab.loc[check, "passing"] == 100).all(), tab.loc[check]
    assert np.isfinite(tab["worst"]).all()
