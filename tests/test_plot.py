"""``lookahead.tools.plots.plot_budgets`` draws without touching the user's matplotlib state."""

from __future__ import annotations

import pytest

from lookahead.stats import DecodeStats
from lookahead.tools.plots import plot_budgets

matplotlib = pytest.importorskip("matplotlib")


@pytest.fixture
def svg_backend():
    """A non-Agg backend, as a user's session might have selected (restored afterwards)."""
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    yield
    matplotlib.use(before)


def _stats(cost_curve=((1, 0.05), (2, 0.08), (16, 0.12))):
    return DecodeStats(target_calls=4, new_tokens=9, budgets=[(0, 0), (6, 0), (3, 4), (8, 0)],
                       accepted_per_step=[0, 3, 1, 2], cost_curve=cost_curve)


@pytest.mark.parametrize("cost_curve", [((1, 0.05), (2, 0.08), (16, 0.12)), None])
def test_plot_keeps_the_backend_and_writes_a_png(svg_backend, tmp_path, cost_curve):
    import matplotlib.pyplot as plt

    figures = plt.get_fignums()
    path = tmp_path / "budget.png"
    assert plot_budgets(_stats(cost_curve), str(path)) == str(path)
    assert matplotlib.get_backend() == "svg"  # was switched to Agg by matplotlib.use("Agg")
    assert plt.get_fignums() == figures  # no pyplot figure left behind (or created)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
