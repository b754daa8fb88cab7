from __future__ import annotations

import html
from pathlib import Path

from tune_fakes import FakeBackend

from sweep.tune.objective import ObjectiveSpec
from sweep.tune.report import best_commands, render_best_sweep_report, write_report
from sweep.tune.space import DeviceInfo, build_space
from sweep.tune.study import TuneObjective, open_study, run_study, storage_url

DEVICE = DeviceInfo(device="cpu", model_max_len=2048, min_model_len=100)


def run(tmp_path: Path, kind: str) -> tuple[Path, list[dict]]:
    space = build_space(DEVICE)
    spec = ObjectiveSpec(kind=kind, max_load=16, load=4)
    study = open_study(storage_url(None, tmp_path), kind, spec, seed=0, info={"model": "fake"})
    backend = FakeBackend(lambda k: k["max_num_seqs"], cannot_start=lambda k: k["block_size"] == 32)
    run_study(study, TuneObjective(space, spec, backend, tmp_path, model_max_len=2048), 8, None, show_progress=False)
    best = best_commands(study, "tiny-random", "vllm serve {model} --port {port} {knob_flags}")
    return write_report(study, tmp_path, best), best


def test_single_objective_report_has_history_importances_slices_and_the_best_command(tmp_path: Path) -> None:
    path, best = run(tmp_path, "max-load")
    page = path.read_text()
    for title in ("Optimisation history", "Parameter importances", "Slice plots", "Trials"):
        assert f"<h2>{title}</h2>" in page
    assert page.count("data:image/png;base64,") == 3
    assert len(best) == 1 and best[0]["serve_command"].startswith("bench serve tiny-random ")
    assert best[0]["launch_command"].startswith("vllm serve tiny-random --port 8000 --")
    assert best[0]["serve_command"] in html.unescape(page)


def test_pareto_report_has_the_front(tmp_path: Path) -> None:
    path, best = run(tmp_path, "pareto")
    page = path.read_text()
    assert "<h2>Pareto front</h2>" in page and "Not available" not in page.split("<h2>Pareto front</h2>")[1][:200]
    assert best and len({str(b["knobs"]) for b in best}) == len(best)


def test_the_best_sweep_report_comes_from_the_renderer_handed_in(tmp_path: Path) -> None:
    calls = []

    def render(run_dirs: list[Path], out_dir: Path, slo: dict[str, float] | None = None) -> Path:
        calls.append((run_dirs, out_dir, slo))
        return out_dir / "report.html"

    run_dir = tmp_path / "trial-3" / "repeat0"
    run_dir.mkdir(parents=True)
    assert render_best_sweep_report(render, str(run_dir), {"ttft_ms": 500.0}) == str(run_dir / "report/report.html")
    assert calls == [([run_dir], run_dir / "report", {"ttft_ms": 500.0})]
    assert render_best_sweep_report(render, str(tmp_path / "missing")) is None
    assert render_best_sweep_report(render, None) is None and len(calls) == 1


def test_the_trial_table_shows_what_a_simulate_first_decision_was_based_on() -> None:
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import create_trial

    from sweep.tune.report import trial_table

    decision = {"decision": "launch", "predicted": 2.8, "optimistic": 4.4, "margin": 0.2, "step_error": 0.38,
                "reference": {"trial": 0, "measured": 6.4, "predicted": 4.0, "value": 4.0}, "reason": "..."}
    study = optuna.create_study(direction="maximize")
    study.add_trial(create_trial(value=7.2, params={"max_num_seqs": 8},
                                 distributions={"max_num_seqs": CategoricalDistribution([4, 8])},
                                 user_attrs={"status": "ok", "predicted_values": [2.8], "prune_decision": decision}))
    table = html.unescape(trial_table(study))
    assert ("<td>2.8: launch; optimistic 4.4 (steps 38% faster); reference 4 = #0 (measured 6.4, predicted 4), "
            "margin 20%</td>") in table
