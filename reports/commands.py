"""`bench report`, `bench gate` and `bench lab gate-study` (hidden old name: `bench gate-study`). Heavy
modules (pandas, matplotlib) are imported inside each command. `bench compare` (sweep/compare/commands.py)
writes its report and gates through reports/compare.py."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from engine.cli_options import knob_option, renamed_command, with_engine_knobs

if TYPE_CHECKING:
    from reports.gate import GateResult

GATE_EXIT_PASS, GATE_EXIT_FAIL, GATE_EXIT_UNUSABLE = 0, 1, 2


def _error(message: str, code: int = GATE_EXIT_UNUSABLE) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def report(
    run_dirs: list[Path] = typer.Argument(
        ..., help="Run directories (`bench sweep --output-dir`), vLLM `bench serve --save-detailed` JSONs, "
        "or GuideLLM JSON reports; several overlay for A/B."
    ),
    slo: str | None = typer.Option(
        None, help="Re-evaluate goodput under this SLO (ms), any subset: "
        "ttft=MS,tpot=MS,e2el=MS,itl_p99=MS,max_stall=MS; per request class as for bench sweep. "
        "Default: the first run's own SLO."
    ),
    out: Path | None = typer.Option(None, help="Output directory (default: <first run>/report)."),
    timeline_point: str | None = typer.Option(None, help="Point label for the request timeline (default: top load)."),
    cost_per_hour: float | None = typer.Option(
        None, help="USD per instance-hour: price every point (default: the price its sweep stored, if any)."
    ),
    gpus_per_instance: int = typer.Option(1, help=(
        "GPUs of one instance (with --cost-per-hour): each point pays for the GPUs its sweep recorded it occupied "
        "(devices_used) out of N; docs/TUNE.md."
    )),
) -> None:
    """Write report.html (self-contained) and report.md (+ plots/*.png) for one or more runs."""
    from rich.progress import Progress

    from reports.importers import RunInputError
    from reports.recompute import parse_slo
    from reports.render import render_report
    from sweep.run.cost import CostConfig

    try:
        slo_ms = parse_slo(slo)
        cost = None if cost_per_hour is None else CostConfig(cost_per_hour, gpus_per_instance)
    except ValueError as exc:
        _error(str(exc))
    first = run_dirs[0]
    out_dir = out or ((first if first.is_dir() else first.parent) / "report")
    with Progress(transient=True) as progress:
        task = progress.add_task("rendering report", total=10)
        try:
            path = render_report(
                run_dirs, out_dir, slo_ms, timeline_point,
                progress=lambda name: progress.update(task, advance=1, description=f"plot: {name}"),
                cost=cost,
            )
        except (RunInputError, ValueError) as exc:
            _error(str(exc))
        except OSError as exc:  # e.g. the default --out beside a result file in a read-only folder
            _error(f"cannot write the report to {out_dir}: {exc.strerror or exc}; pass --out DIR")
    typer.echo(f"wrote {path} and {out_dir / 'report.md'}")


def _write_first_run_note(store: Path, candidate: Path, run_id: str, markdown: Path | None) -> None:
    note = (f"### bench gate: no baseline yet\n\n`{store}` held no blessed run, so nothing was compared: "
            f"`{candidate}` (run_id `{run_id}`) is now the baseline, and later runs are gated against it.\n")
    typer.echo(note)
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(note)


def gate(
    candidate: Path = typer.Option(..., help="The run under test (run directory or importable result)."),
    baseline: Path | None = typer.Option(None, help="The reference run; or use --baseline-store."),
    baseline_store: Path | None = typer.Option(None, help="A baseline store directory (the blessed run)."),
    update_baseline: bool = typer.Option(
        False, "--update-baseline", help="Bless --candidate into --baseline-store (records its config) and exit."
    ),
    metric: str = typer.Option(
        "ttft_p90,tpot_p50,failure_rate", help="Comma-separated <ttft|tpot|itl|e2el|itl_p99|max_stall>_<mean|median|"
        "pNN> or failure_rate (itl: pooled chunk gaps; itl_p99: each request's own p99 gap, e.g. itl_p99_p95; "
        "max_stall: each request's longest gap)."
    ),
    max_regression: str = typer.Option("5%", help="Fail only above this relative slow-down, e.g. 5% or 0.05."),
    max_failure_increase: str = typer.Option(
        "0%", help="failure_rate: fail only above this increase in percentage points, e.g. 1%."
    ),
    slo: str | None = typer.Option(
        None, help="Also gate SLO attainment and goodput under this SLO (ms), as for bench sweep: ttft, tpot, e2el, "
        "itl_p99, max_stall, valid, per request class ('e2el=30000;interactive:ttft=500'): slo_attainment and "
        "request_goodput rows per point, and per class."
    ),
    max_attainment_drop: str = typer.Option(
        "0%", help="slo_attainment: fail only above this drop in percentage points, e.g. 2%."
    ),
    max_goodput_drop: str = typer.Option(
        "5%", help="request_goodput (with --slo): fail only above this relative drop, e.g. 10% or 0.1."
    ),
    ignore_workload: bool = typer.Option(
        False, "--ignore-workload", help="Skip the same-workload check (e.g. a vLLM result against a sweep)."
    ),
    alpha: float = typer.Option(0.05, help="Family-wise significance level (Holm over all points x metrics)."),
    n_boot: int = typer.Option(2000, help="Bootstrap resamples (raised automatically for many tests)."),
    seed: int = typer.Option(0, help="Bootstrap seed."),
    noise_floor: str | None = typer.Option(
        None, help="Between-run relative SD (e.g. 8%) added to a side measured once (no --repeats); default: "
        "measured from --baseline-store's blessed history when it has 3+ runs of the same workload."
    ),
    junit_xml: Path | None = typer.Option(None, help="Write JUnit XML (one test case per metric and point)."),
    markdown: Path | None = typer.Option(None, help="Also write the Markdown table here (for a PR comment)."),
    json_out: Path | None = typer.Option(
        None, "--json", help="Also write the verdict as JSON (config, notes, every row's figures)."
    ),
    note: str | None = typer.Option(None, help="When blessing: a note stored in the manifest."),
    bless_if_missing: bool = typer.Option(
        False, "--bless-if-missing", help="With --baseline-store: when the store holds no baseline yet (a first CI "
        "run), bless --candidate, say so, and pass instead of exit 2."
    ),
) -> None:
    """Compare a candidate run with a baseline: exit 0 pass, 1 significant regression, 2 unusable input."""
    from reports.baseline import baseline_run_dir, has_baseline
    from reports.baseline import update_baseline as bless
    from reports.gate import (
        GateConfig,
        GateInputError,
        parse_metric,
        parse_threshold,
        run_gate,
    )
    from reports.importers import RunInputError, load_run
    from reports.recompute import normalize_slo, parse_slo

    try:
        if update_baseline:
            if baseline_store is None:
                _error("--update-baseline needs --baseline-store DIR")
            manifest = bless(baseline_store, candidate, note)
            typer.echo(f"blessed {candidate} as the baseline in {baseline_store} (run_id {manifest['run_id']})")
            raise typer.Exit(GATE_EXIT_PASS)
        if (baseline is None) == (baseline_store is None):
            _error("give exactly one of --baseline RUN_DIR or --baseline-store DIR")
        if bless_if_missing and baseline_store is None:
            _error("--bless-if-missing needs --baseline-store DIR")
        config = GateConfig(
            metrics=tuple(m.strip() for m in metric.split(",") if m.strip()),
            max_regression=parse_threshold(max_regression),
            max_failure_increase=parse_threshold(max_failure_increase),
            check_workload=not ignore_workload,
            alpha=alpha,
            n_boot=n_boot,
            seed=seed,
            noise_floor=parse_threshold(noise_floor) if noise_floor is not None else None,
            slo=normalize_slo(parse_slo(slo)),
            max_attainment_drop=parse_threshold(max_attainment_drop),
            max_goodput_drop=parse_threshold(max_goodput_drop),
        )
        if slo is not None and not config.slo:
            _error(f"--slo {slo!r} sets no limit")
        if not config.metrics:
            _error("--metric is empty")
        if not 0 < alpha < 1:
            _error("--alpha must be between 0 and 1")
        for spec in config.metrics:  # a typo in the flags fails now, not first on the run after a blessing
            parse_metric(spec)
        if bless_if_missing and not has_baseline(baseline_store):
            manifest = bless(baseline_store, candidate, note)
            _write_first_run_note(baseline_store, candidate, manifest["run_id"], markdown)
            raise typer.Exit(GATE_EXIT_PASS)
        base_path = baseline if baseline is not None else baseline_run_dir(baseline_store)
        base_run, cand_run = load_run(base_path), load_run(candidate)
        result = run_gate(base_run, cand_run, config, store=baseline_store)
    except (RunInputError, GateInputError, ValueError) as exc:
        _error(str(exc))
    _emit(result, str(base_path), str(candidate), markdown, junit_xml, json_out)


def _emit(
    result: GateResult, base_name: str, cand_name: str, markdown: Path | None, junit_xml: Path | None,
    json_out: Path | None,
) -> None:
    """Print the gate's table, write --markdown / --junit-xml / --json, and exit with the verdict's code."""
    from reports.gate_output import to_markdown, write_json, write_junit

    table = to_markdown(result, base_name, cand_name)
    typer.echo(table)
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(table)
    if junit_xml is not None:
        write_junit(result, junit_xml)
    if json_out is not None:
        write_json(result, base_name, cand_name, json_out)
    raise typer.Exit(GATE_EXIT_PASS if result.passed else GATE_EXIT_FAIL)


@with_engine_knobs
def gate_study(
    engine_knobs: dict[str, Any],
    model: str = knob_option("model", "tiny-random", help="Model both sides serve."),
    ref: str = typer.Option("HEAD", help="The git ref both sides serve (the candidate with an injected delay)."),
    aa_trials: int = typer.Option(20, help="A/A trials (`bench compare` of the ref against itself)."),
    detection_trials: int = typer.Option(8, help="Trials per injected slow-down."),
    regressions: str = typer.Option("10%,20%,40%", help="Injected TPOT slow-downs, relative to the A/A runs."),
    max_regressions: str = typer.Option("5%,10%,15%,20%", help="Gate thresholds to evaluate."),
    concurrency: str = typer.Option("1,2,4", help="Closed-loop streams per point."),
    num_prompts: int = typer.Option(64, help="Requests per point and repeat (variants also use half)."),
    repeats: int = typer.Option(3, help="Repeats per side (variants use 1..R of them)."),
    input_len: int = typer.Option(128, help="Prompt tokens (random workload)."),
    output_len: int = typer.Option(32, help="Output tokens (random workload)."),
    seed: int = typer.Option(0, help="Workload seed."),
    output_dir: Path = typer.Option(Path("results/gate-study"), help="Trials, gate_study.json and gate_study.md."),
    resume: bool = typer.Option(False, "--resume", help="Continue the study in --output-dir."),
    analyse_only: bool = typer.Option(False, "--analyse-only", help="Only re-analyse the finished trials."),
) -> None:
    """Measure the gate's A/A false-alarm rate and its detection rate of injected TPOT slow-downs on real
    interleaved `bench compare --together` runs of this machine, for several gate variants (minutes to hours)."""
    from reports.gate import parse_threshold
    from reports.gate_study import TRIALS_FILE, GateStudyConfig, analyse, read_trials, run_trials
    from sweep.point.runner import WorkloadConfig
    from sweep.run.sweeper import SweepConfig

    try:
        study = GateStudyConfig(
            sweep=SweepConfig(
                output_dir=output_dir, values=[float(c) for c in concurrency.split(",") if c.strip()], model=model,
                engine_knobs={**engine_knobs, "seed": seed},
                workload=WorkloadConfig(workload="random", input_len=input_len, output_len=output_len, seed=seed),
                num_prompts=num_prompts, repeats=repeats, calibration=True,
            ),
            ref=ref, aa_trials=aa_trials, detection_trials=detection_trials,
            regressions=tuple(parse_threshold(s) for s in regressions.split(",") if s.strip()),
            thresholds=tuple(parse_threshold(s) for s in max_regressions.split(",") if s.strip()),
        )
        started = (output_dir / TRIALS_FILE).exists()
        if started and not (resume or analyse_only):
            raise ValueError(f"{output_dir} holds a study already: --resume it, --analyse-only, or pick another dir")
        if analyse_only:
            trials = read_trials(output_dir)
        else:
            trials = run_trials(study, log=lambda line: typer.echo(line, err=True))
        summary = analyse(study, trials)
    except (ValueError, RuntimeError) as exc:
        _error(str(exc))
    except KeyboardInterrupt:
        _error(f"interrupted: finished trials are kept in {output_dir}; continue with the same flags and --resume")
    typer.echo((output_dir / "gate_study.md").read_text())
    typer.echo(f"{summary['trials']} trials; details in {output_dir / 'gate_study.json'}")


def register(app: typer.Typer, groups: dict[str, typer.Typer]) -> None:
    """Add this package's commands to the `bench` app and its `lab` group."""
    app.command("report")(report)
    app.command("gate")(gate)
    groups["lab"].command("gate-study")(gate_study)
    app.command("gate-study", hidden=True)(renamed_command(gate_study, "bench lab gate-study"))
