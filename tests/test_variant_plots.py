"""nslib.viz.variant_plots on hand-made frames: labels by hand, and what each figure shows (its
bars, measured ticks, lines and scales)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from nslib.viz.variant_plots import (config_labels, fusion_bars, parallel_bars,  # noqa: E402
                                     whatif_lines)


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def frame():
    """Two GPUs x one config x two predictors; measured 10 ms on GPU A, 20 ms on GPU B."""
    rows = [{"gpu": gpu, "config": "gpt2 b4", "strategy": "tp4", "predictor": p,
             "e2e_ms": meas, "pred_ms": meas * k, "base_e2e_ms": 2 * meas,
             "base_pred_ms": 2 * meas * k, "measured": 2.0, "predicted": 2.0}
            for gpu, meas in (("NVIDIA GPU A", 10.0), ("GPU B", 20.0))
            for p, k in (("p1", 1.1), ("p2", 0.5))]
    return pd.DataFrame(rows)


def _bars(ax):
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_height() > 0]


def test_config_labels_by_hand():
    f = frame()
    assert config_labels(f, "config").tolist()[::2] == ["GPU A\ngpt2 b4", "GPU B\ngpt2 b4"]
    assert config_labels(f, "config", "strategy").iloc[0] == "GPU A\ngpt2 b4 tp4"


def test_fusion_bars_show_latency_and_speedup():
    fig = fusion_bars(frame())
    left, right = fig.axes[:2]
    # 2 labels x 2 predictors of fused ms, log scale, measured 10 and 20 ms as ticks
    assert sorted(b.get_height() for b in _bars(left)) == pytest.approx([5, 10, 11, 22])
    assert left.get_yscale() == "log"
    ticks = left.collections[0].get_offsets()
    assert np.asarray(ticks)[:, 1].tolist() == [10.0, 20.0]
    # speed-ups: 2 labels x (2 predictors + measured), all 2x
    assert [b.get_height() for b in _bars(right)] == pytest.approx([2.0] * 6)
    assert right.get_ylim()[0] == pytest.approx(0.9)


def test_parallel_bars_widen_with_the_labels():
    f = frame()
    fig = parallel_bars(f)
    assert fig.get_size_inches()[0] == 6        # two labels: the minimum width
    many = pd.concat([f.assign(config=f"c{i}") for i in range(10)], ignore_index=True)
    fig = parallel_bars(many)
    assert fig.get_size_inches()[0] == pytest.approx(0.9 * 20)
    assert len(_bars(fig.axes[0])) == 20 * 2


def test_whatif_lines():
    rows = [{"strategy": s, "degree": d, "link_gbps": 900.0, "step_ms": 100.0 / d * k,
             "comm_ms": 1.0} for s, k in (("dp", 1.0), ("tp", 1.5)) for d in (1, 2, 4)]
    rows += [{"strategy": s, "degree": 4, "link_gbps": bw, "step_ms": 1000.0 / bw,
              "comm_ms": 1.0} for s in ("dp", "tp") for bw in (64.0, 600.0, 1800.0)]
    fig = whatif_lines(pd.DataFrame(rows), [1, 2, 4], 4, 900.0, title="m batch 8 on G")
    left, right = fig.axes
    labels = [ln.get_label() for ln in left.get_lines()]
    assert labels == ["DP", "TP", "ideal (1 / n)"]
    # the ideal line divides DP's one-GPU step by the degree
    assert left.get_lines()[2].get_ydata().tolist() == [100.0, 50.0, 25.0]
    assert left.get_title() == "m batch 8 on G"
    assert [t.get_text() for t in left.get_xticklabels()] == ["1", "2", "4"]
    # right: the sweep at degree 4 (the 900 GB/s default point included), sorted by bandwidth
    dp = right.get_lines()[0]
    assert dp.get_xdata().tolist() == [64.0, 600.0, 900.0, 1800.0]
    assert right.get_title() == "degree 4" and right.get_xscale() == "log"
