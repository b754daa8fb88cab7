"""`bench compare` and its hidden old names `bench ab` and `bench compare-llama-cpp`; `bench lab vllm-agreement`.

The report and the gate belong to reports/, which the sweep never imports: `register` takes them as `judge`
(the `reports.compare` module, wired in cli.py), and each command gets it as its context's `obj`.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import typer

from engine.cli_options import knob_option, with_engine_knobs
from sweep.cli_options import fail, floats, interrupt_on_sigterm, shared_option, synthetic_lengths
from sweep.compare.targets import Target, TargetError, check_targets, parse_target

if TYPE_CHECKING:  # the sweep config module loads the HTTP client: only when a command runs
    from sweep.run.sweep_config import SweepConfig

GATE_PANEL = "Gate"
EXIT_PASS, EXIT_FAIL = 0, 1
TARGET_HELP = (
    "NAME=SPEC, repeated; the first is the baseline. SPEC: engine[:KNOB=V,...] (bench serve with these engine "
    "knobs), ref:GITREF[:KNOB=V,...] (this repository at a git ref), cmd:TEMPLATE (a launch template with {model} "
    "{host} {port}), url:http://HOST:PORT (a running server), llama.cpp (llama.cpp's server on the model's GGUF) or "
    "vllm[:KNOB=V,...] (`vllm serve` on --vllm-model's HF directory, these knobs as vLLM's flags)."
)


class Judge(Protocol):
    """What `bench compare` needs from reports/ (reports.compare): the overlaid report and the gate."""

    GateOptions: Any

    def write_compare(self, runs: dict[str, Path], out_dir: Path, verdicts: list[Any] | None = None) -> Path: ...

    def check_gate_options(self, options: Any) -> None: ...

    def gate_targets(self, runs: dict[str, Path], options: Any) -> list[Any]: ...

    def write_junit(self, verdict: Any, path: Path) -> Path: ...


def on_cpu_host() -> bool:
    import torch

    return not torch.cuda.is_available()


def execute(
    judge: Judge | None,
    sweep_config: SweepConfig,
    targets: list[Target],
    together: bool,
    gate: bool,
    gate_options: dict[str, Any],
    junit_xml: Path | None = None,
    markdown: Path | None = None,
    vllm_model: str | None = None,
    vllm_command: str | None = None,
) -> None:
    """Measure the targets, write the report, gate when asked; exits 0 pass, 1 regression, 2 unusable input."""
    from sweep.compare.rounds import CompareConfig, run_compare

    if judge is None:
        fail("bench compare needs the report module (run it as `bench compare`)")
    out_dir = sweep_config.output_dir
    try:
        options = judge.GateOptions(**gate_options)
        if gate:
            judge.check_gate_options(options)
        runs = run_compare(CompareConfig(sweep_config, targets, together, vllm_model, vllm_command))
        verdicts = judge.gate_targets(runs, options) if gate else []
        path = judge.write_compare(runs, out_dir, verdicts)
    except (ValueError, FileExistsError, FileNotFoundError, RuntimeError) as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail(f"interrupted: finished rounds are kept in {out_dir}; continue with the same flags and --resume")
    typer.echo((out_dir / "compare.md").read_text())
    typer.echo(f"report: {path}")
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text("\n".join(v.table for v in verdicts) if verdicts else (out_dir / "compare.md").read_text())
    if junit_xml is not None:
        for verdict in verdicts:
            judge.write_junit(verdict, junit_xml if len(verdicts) == 1 else junit_xml.with_stem(
                f"{junit_xml.stem}-{verdict.target}"))  # fmt: skip
    if gate:
        raise typer.Exit(EXIT_PASS if all(v.passed for v in verdicts) else EXIT_FAIL)


def parse_targets(specs: list[str]) -> list[Target]:
    try:
        targets = [parse_target(spec) for spec in specs]
        check_targets(targets)
    except TargetError as e:
        raise typer.BadParameter(str(e), param_hint="--target") from None
    return targets


@with_engine_knobs
def compare(
    ctx: typer.Context,
    engine_knobs: dict[str, Any],
    target: list[str] = typer.Option(..., "--target", help=TARGET_HELP),
    concurrency: str | None = shared_option("concurrency", help="Closed-loop streams per point (default 1,2,4 "
                                            "without --request-rate)."),
    request_rate: str | None = shared_option("request_rate"),
    burstiness: float = shared_option("burstiness"),
    max_concurrency: int | None = shared_option("max_concurrency"),
    num_prompts: int | None = shared_option("num_prompts", 32, help="Requests per point and round "
                                            "(docs/GATE.md: why 32)."),
    duration: float | None = shared_option("duration"),
    num_warmups: int = shared_option("num_warmups"),
    endpoint: str = shared_option("endpoint"),
    workload: str = shared_option("workload"),
    input_len: int | None = shared_option("input_len"),
    output_len: int | None = shared_option("output_len"),
    random_range_ratio: float = shared_option("random_range_ratio"),
    fit_policy: str = shared_option("fit_policy"),
    slo: str | None = shared_option("slo"),
    percentiles: str = shared_option("percentiles"),
    model: str = knob_option("model", "smollm2-135m", help="Model every target serves (sent in requests)."),
    tokenizer: str | None = knob_option("tokenizer", help="Tokenizer for prompt synthesis, and the built-in "
                                        "engine's; default: --model."),
    seed: int | None = knob_option("seed", help="Workload seed (default 0); when given, the engines' seed too."),
    max_model_len: int | None = knob_option("max_model_len", help="Fit the workload to this context (and the "
                                            "engines' max_model_len)."),
    rounds: int = typer.Option(3, help="Rounds: each measures every target on every load (docs/GATE.md: why 3)."),
    one_at_a_time: bool | None = typer.Option(
        None, "--one-at-a-time/--together", help="Start and stop each target per round, or keep every server up "
        "and interleave point by point (default: one at a time without CUDA, together with it)."
    ),
    calibration: bool = typer.Option(True, "--calibration/--no-calibration",
                                     help="Record a machine-speed calibration in each run's config.json."),
    gate: bool = typer.Option(False, "--gate", help="Gate the baseline against every other target: exit 0 pass, "
                              "1 regression, 2 unusable input.", rich_help_panel=GATE_PANEL),
    metric: str = typer.Option("ttft_p90,tpot_p50,e2el_p90,failure_rate", help="Gate metrics (as for bench gate).",
                               rich_help_panel=GATE_PANEL),
    max_regression: str = typer.Option("10%", help="Fail only above this relative slow-down.",
                                       rich_help_panel=GATE_PANEL),
    alpha: float = typer.Option(0.05, help="Family-wise significance level.", rich_help_panel=GATE_PANEL),
    noise_floor: str | None = typer.Option(None, help="Between-run relative SD for a target measured once.",
                                           rich_help_panel=GATE_PANEL),
    junit_xml: Path | None = typer.Option(None, help="Write the gate's JUnit XML (<stem>-<target> for several).",
                                          rich_help_panel=GATE_PANEL),
    markdown: Path | None = typer.Option(None, help="Also write the gate's Markdown tables here.",
                                         rich_help_panel=GATE_PANEL),
    output_dir: Path = typer.Option(Path("results/compare"), help="Writes <dir>/<NAME> per target and "
                                    "<dir>/compare.{md,json,html}."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted compare in --output-dir."),
    vllm_model: str | None = typer.Option(None, help="The HF directory (or hub id) a vllm target loads; it serves "
                                          "it as --model, the name requests send. `bench model export-hf` writes one."),
    vllm_command: str | None = typer.Option(None, help="A vllm target's executable [default: .venv-vllm/bin/vllm "
                                            "(`make vllm`), else vllm on PATH]."),
) -> None:
    """Compare servers on one workload in interleaved rounds: ratios to the first target, one report; --gate."""
    from sweep.point.benchmark_metrics import parse_slo
    from sweep.point.runner import WorkloadConfig
    from sweep.run.sweep_config import SweepConfig

    interrupt_on_sigterm()
    targets = parse_targets(target)
    if rounds < 1:
        fail(f"--rounds must be >= 1, got {rounds}")
    if concurrency is not None and request_rate is not None:
        fail("give one of --concurrency or --request-rate")
    mode = "rate" if request_rate is not None else "concurrency"
    values = floats(request_rate, "--request-rate") if request_rate is not None else floats(
        concurrency or "1,2,4", "--concurrency")  # fmt: skip
    shared = {"tokenizer": tokenizer, "seed": seed, "max_model_len": max_model_len}
    knobs = {**engine_knobs, **{k: v for k, v in shared.items() if v is not None}}
    together = not (on_cpu_host() if one_at_a_time is None else one_at_a_time)
    try:
        config = SweepConfig(
            output_dir=output_dir, mode=mode, values=values, model=model, tokenizer=tokenizer, engine_knobs=knobs,
            workload=WorkloadConfig(
                workload=workload, **synthetic_lengths(workload, input_len, output_len), range_ratio=random_range_ratio,
                max_model_len=max_model_len, fit_policy=fit_policy, seed=seed if seed is not None else 0,
                endpoint=endpoint,
            ),
            num_prompts=num_prompts, duration=duration, burstiness=burstiness, max_concurrency=max_concurrency,
            num_warmups=num_warmups, slo=parse_slo(slo), percentiles=floats(percentiles, "--percentiles"),
            repeats=rounds, resume=resume, calibration=calibration,
        )  # fmt: skip
    except ValueError as e:
        fail(str(e))
    gate_options = {"metric": metric, "max_regression": max_regression, "alpha": alpha, "noise_floor": noise_floor,
                    "slo": config.slo}  # the gate also judges attainment and goodput under the sweep's SLO
    execute(ctx.obj, config, targets, together, gate, gate_options, junit_xml, markdown, vllm_model, vllm_command)


def _side(name: str, ref: str | None, command: str | None, args: str) -> Target:
    if (ref is None) == (command is None):
        fail(f"give the {name} exactly one of --{name}-ref or --{name}-command")
    extra = tuple(shlex.split(args))
    return Target(name, "ref", ref, extra_args=extra) if ref is not None else Target(name, "cmd", command or "",
                                                                                    extra_args=extra)


@with_engine_knobs
def ab(
    ctx: typer.Context,
    engine_knobs: dict[str, Any],
    model: str = knob_option("model", "smollm2-135m", help="Model both sides serve."),
    baseline_ref: str | None = typer.Option(None, help="Baseline: a git ref of this repository."),
    baseline_command: str | None = typer.Option(None, help="Baseline: a server launch template instead."),
    baseline_args: str = typer.Option("", help="Extra arguments for the baseline's server command."),
    candidate_ref: str | None = typer.Option(None, help="Candidate: a git ref (e.g. HEAD)."),
    candidate_command: str | None = typer.Option(None, help="Candidate: a server launch template instead."),
    candidate_args: str = typer.Option("", help="Extra arguments for the candidate's server command."),
    concurrency: str = typer.Option("1,2,4", help="Closed-loop streams per point."),
    num_prompts: int = typer.Option(32, help="Requests per point and repeat."),
    repeats: int = typer.Option(3, help="Interleaved repeats per side."),
    workload: str = typer.Option("random", help="Workload (as for bench sweep)."),
    input_len: int | None = typer.Option(128, help="Prompt tokens (fixed/random workloads)."),
    output_len: int | None = typer.Option(32, help="Output tokens (fixed/random workloads)."),
    seed: int = typer.Option(0, help="Workload seed."),
    slo: str | None = typer.Option(None, help="SLO, e.g. ttft=500,tpot=50 (as for bench sweep)."),
    output_dir: Path = typer.Option(Path("results/ab"), help="Writes <dir>/baseline and <dir>/candidate."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted A/B in --output-dir."),
    metric: str = typer.Option("ttft_p90,tpot_p50,e2el_p90,failure_rate", help="Gate metrics (as for bench gate)."),
    max_regression: str = typer.Option("10%", help="Fail only above this relative slow-down."),
    alpha: float = typer.Option(0.05, help="Family-wise significance level."),
    noise_floor: str | None = typer.Option(None, help="Between-run relative SD for a side measured once."),
    junit_xml: Path | None = typer.Option(None, help="Write JUnit XML."),
    markdown: Path | None = typer.Option(None, help="Also write the Markdown table here."),
) -> None:
    """Interleaved A/B (old name of `bench compare ... --together --gate`)."""
    from sweep.point.benchmark_metrics import parse_slo
    from sweep.point.runner import WorkloadConfig
    from sweep.run.sweep_config import SweepConfig

    typer.echo("note: this command is now `bench compare --target baseline=SPEC --target candidate=SPEC --together "
               "--gate` (SPEC: ref:GITREF or cmd:TEMPLATE); the old name goes in the next release", err=True)
    targets = [_side("baseline", baseline_ref, baseline_command, baseline_args),
               _side("candidate", candidate_ref, candidate_command, candidate_args)]  # fmt: skip
    try:
        config = SweepConfig(
            output_dir=output_dir, values=floats(concurrency, "--concurrency"), model=model,
            engine_knobs={**engine_knobs, "seed": seed},
            workload=WorkloadConfig(workload=workload, input_len=input_len, output_len=output_len, seed=seed),
            num_prompts=num_prompts, repeats=repeats, slo=parse_slo(slo), resume=resume, calibration=True,
        )  # fmt: skip
    except ValueError as e:
        fail(str(e))
    gate_options = {"metric": metric, "max_regression": max_regression, "alpha": alpha, "noise_floor": noise_floor,
                    "slo": config.slo}  # the gate also judges attainment and goodput under the sweep's SLO
    execute(ctx.obj, config, targets, True, True, gate_options, junit_xml, markdown)


def compare_llama_cpp(
    ctx: typer.Context,
    model: str = typer.Option("smollm2-135m", help="Model alias whose GGUF both servers load."),
    settings: str = typer.Option("none,int8,int4", help="Comma-separated `bench serve --quantization` settings."),
    concurrency: str = typer.Option("1", help="Comma-separated concurrencies (one sweep point each)."),
    num_prompts: int = typer.Option(8, help="Requests per point."),
    input_len: int = typer.Option(256, help="Prompt tokens."),
    output_len: int = typer.Option(128, help="Output tokens (llama.cpp may stop earlier at EOS)."),
    rounds: int = typer.Option(2, help="Interleaved rounds over the targets."),
    threads: int | None = typer.Option(None, help="Both servers' threads [default: torch's for ours, 2 for "
                                       "llama.cpp]."),
    output_dir: Path = typer.Option(Path("compare-llama-cpp"), help="Run directories and the compare report."),
) -> None:
    """`bench serve` at each quantization against llama.cpp's server (old name of `bench compare`)."""
    from sweep.point.runner import WorkloadConfig
    from sweep.run.sweep_config import SweepConfig

    items = [s.strip() for s in settings.split(",") if s.strip()]
    spelling = " ".join(["bench compare --target llama.cpp=llama.cpp",
                         *(f"--target {q}=engine:quantization={q}" for q in items), "--one-at-a-time"])  # fmt: skip
    typer.echo(f"note: this command is now `{spelling}`; the old name goes in the next release", err=True)
    if rounds < 1 or num_prompts < 1 or input_len < 1 or output_len < 2:
        raise typer.BadParameter("--rounds, --num-prompts, --input-len must be >= 1, --output-len >= 2")
    targets = parse_targets(["llama.cpp=llama.cpp", *(f"{q}=engine:quantization={q}" for q in items)])
    knobs: dict[str, Any] = {"max_model_len": input_len + output_len + 64}
    if threads is not None:
        knobs["cpu_threads"] = threads
    try:
        config = SweepConfig(
            output_dir=output_dir, values=floats(concurrency, "--concurrency"), model=model, tokenizer=model,
            engine_knobs=knobs, temperature=0.0, num_warmups=1, num_prompts=num_prompts, repeats=rounds,
            workload=WorkloadConfig(workload="random", input_len=input_len, output_len=output_len),
        )  # fmt: skip
    except ValueError as e:
        fail(str(e))
    execute(ctx.obj, config, targets, False, False, {})


def vllm_agreement(
    url: str = typer.Option(..., help="The server both clients measure (its root, e.g. http://127.0.0.1:8000)."),
    model: str = typer.Option(..., help="The served model name both clients send."),
    tokenizer: str = typer.Option(..., help="An HF tokenizer directory both clients tokenise with."),
    vllm: str = typer.Option(
        "vllm", help="The vLLM executable whose `bench serve` runs (`make vllm` installs .venv-vllm/bin/vllm)."
    ),
    endpoint: str = typer.Option("completions", help="completions (vLLM's --backend openai) | chat (openai-chat)."),
    concurrency: str = typer.Option("1,16", help="Concurrencies, comma-separated; each client runs every one."),
    num_prompts: int = typer.Option(16, help="Measured requests per run (both clients add one unmeasured first)."),
    input_len: int = typer.Option(256, help="Prompt tokens of every request (random tokens)."),
    output_len: int = typer.Option(128, help="Output tokens of every request (ignore-EOS, greedy)."),
    rounds: int = typer.Option(2, help="Rounds; the clients' order alternates (ABBA)."),
    seed: int = typer.Option(0, help="Base seed; every (round, concurrency) pair of runs gets its own."),
    tolerance: float = typer.Option(0.03, help="Largest |bench sweep / vllm bench serve - 1| that agrees."),
    api_key: str | None = typer.Option(None, help="Bearer token for the server."),
    output_dir: Path = typer.Option(Path("results/vllm-agreement"), help="Every run's files and agreement.json."),
) -> None:
    """Measure one server with vLLM's client and ours, interleaved: median TTFT, median TPOT and output throughput
    side by side per concurrency; exit 1 when a figure differs by more than --tolerance."""
    from sweep.compare.vllm_agreement import AgreementConfig, AgreementError, agreement_table, run_agreement

    try:
        concurrencies = [int(v) for v in concurrency.split(",") if v.strip()]
        cfg = AgreementConfig(url, model, tokenizer, output_dir, vllm, endpoint, concurrencies, num_prompts,
                              input_len, output_len, rounds, seed, tolerance, api_key)  # fmt: skip
    except (ValueError, AgreementError) as err:
        fail(f"bench lab vllm-agreement: {err}")
    try:
        result = run_agreement(cfg, say=lambda line: typer.echo(line, err=True))
    except (AgreementError, RuntimeError, OSError) as err:
        typer.echo(f"bench lab vllm-agreement: {err}", err=True)
        raise typer.Exit(2) from err
    typer.echo(agreement_table(result))
    typer.echo(f"agreement.json: {cfg.output_dir / 'agreement.json'}")
    if not all(row["agrees"] for row in result["agreement"]):
        raise typer.Exit(1)


def register(app: typer.Typer, groups: dict[str, typer.Typer], judge: Judge | None = None) -> None:
    """Add `bench compare` (and the hidden `bench ab`, `bench compare-llama-cpp`) to the `bench` app and
    `bench lab vllm-agreement` to its lab group; `judge` writes the report and runs the gate (it reaches the
    commands as their context's `obj`)."""
    groups["lab"].command("vllm-agreement")(vllm_agreement)
    settings = {"obj": judge}
    app.command("compare", context_settings=settings)(compare)
    app.command("ab", hidden=True, context_settings=settings)(ab)
    app.command("compare-llama-cpp", hidden=True, context_settings=settings)(compare_llama_cpp)
