"""``lookahead.tools.plots.plot_bench`` draws without touching the user's matplotlib state."""

from __future__ import annotations

import pytest

from lookahead.tools.plots import plot_bench

matplotlib = pytest.importorskip("matplotlib")


@pytest.fixture
def svg_backend():
    """A non-Agg backend, as a user's session might have selected (restored afterwards)."""
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    yield
    matplotlib.use(before)


def _result() -> dict:
    """The parts of a benchmark run's result that ``plot_bench`` reads: two workloads, one method beside plain."""
    summary = [dict(workload=wl, method=m, status="ok", speedup_median=med, speedup_min=med - 0.1,
                    speedup_max=med + 0.2, accepted_hist={"0": 5, "1": 2, "3": 1} if wl == "all" else None)
               for wl in ("code", "chat", "all") for m, med in (("plain", 1.0), ("lookahead", 1.4))]
    records = [dict(workload=wl, prompt_id=f"{wl}-{i}", method="lookahead", speedup_vs_plain=1.2 + 0.1 * i)
               for wl in ("code", "chat") for i in range(3)]
    context = dict(model=dict(name="tiny"), mode="greedy",
                   hardware=dict(gpu=None, cpu="some CPU", torch_threads=1))
    return dict(summary=summary, records=records, context=context, settings=dict(max_new_tokens=16))


def test_plot_keeps_the_backend_and_writes_a_png(svg_backend, tmp_path):
    import matplotlib.pyplot as plt

    figures = plt.get_fignums()
    path = tmp_path / "bench.png"
    assert plot_bench(_result(), str(path)) == str(path)
    assert matplotlib.get_backend() == "svg"  # was switched to Agg by matplotlib.use("Agg")
    assert plt.get_fignums() == figures  # no pyplot figure left behind (or created)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
