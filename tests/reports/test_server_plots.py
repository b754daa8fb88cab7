"""The server-metrics figure: one panel per metric a run recorded, beside the client's TTFT; none without any."""

from __future__ import annotations

from synthetic_runs import synthetic_run

from reports.server_plots import server_metrics_vs_load


def test_server_panels_follow_the_recorded_metrics() -> None:
    plain = synthetic_run("plain", seed=1, loads=[1, 2, 4])
    assert server_metrics_vs_load([plain]) is None
    scraped = synthetic_run("scraped", seed=2, loads=[1, 2, 4])
    scraped.points["prefix_cache_hit_rate"] = [0.1, 0.3, 0.5]
    scraped.points["spec_decode_acceptance_rate"] = [70.0, 65.0, 60.0]
    fig = server_metrics_vs_load([plain, scraped])
    assert fig is not None
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["client TTFT", "prefix-cache hit rate", "speculative acceptance rate"]
    hit_rate = [line for line in fig.axes[1].get_lines() if line.get_label() == "scraped"][0]
    assert list(hit_rate.get_ydata()) == [0.1, 0.3, 0.5]
