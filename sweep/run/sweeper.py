"""A whole sweep: the target (a URL, or the built-in engine launched here), every point, the run directory.

`Sweeper.measure(load)` runs (or, on resume, reloads) one point and returns its point dict; `Sweeper.run()`
walks the configured loads or runs the `--max-load-under-slo` search. The tuner drives `measure` directly.
A rate point the over-saturation detector marks (sweep.point.saturation) counts as failing the SLO in the search;
with `--stop-when-saturated` it ends early and `run()` skips the higher loads (listed in skipped.json).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sweep.point.benchmark_metrics import calculate_metrics, percentile_name, queue_inclusive_applies
from sweep.point.client import ClientConfig
from sweep.point.point_fields import extra_point_fields, point_window
from sweep.point.prompts import build_prompts, check_slo_classes
from sweep.point.records import RequestRecord
from sweep.point.runner import PointRun, PointSpec, run_point
from sweep.point.saturation import (
    SaturationConfig,
    is_saturated,
    not_judged_message,
    reference_for,
    saturated_verdict,
    saturation_fields,
    saturation_message,
)
from sweep.point.steady_state import windowed_point
from sweep.run import results
from sweep.run.launcher import ServerProcess, launch
from sweep.run.repeats import pooled_point, repeat_order
from sweep.run.run_info import check_reachable, check_target_healthy, client_fidelity, run_config, workload_fidelity
from sweep.run.search import SearchConfig, SearchResult, answer_text, max_load_under_slo, point_counts, search_record
from sweep.run.sweep_config import SweepConfig


def calibrate(console: Console) -> dict[str, Any]:
    """The machine calibration config.json records (sweep.mock.machine_speed), with a status line."""
    from sweep.mock.machine_speed import machine_calibration

    with console.status("calibrating machine speed (--no-calibration skips it)"):
        return machine_calibration()


class Sweeper:
    def __init__(
        self, config: SweepConfig, console: Console | None = None, calibration: dict[str, Any] | None = None
    ) -> None:
        """`calibration`: a machine calibration measured by the caller (bench compare --together measures one for
        servers that run side by side) recorded instead of measuring one here."""
        self.config = config
        self.console = console or Console(stderr=True)
        self.server: ServerProcess | None = None
        self.writer: results.RunWriter | None = None
        self.tokenizer: Any = None
        self.client: ClientConfig | None = None
        self.salt = uuid.uuid4().hex[:12]
        self.calibration = calibration
        self._header_printed = False
        # rate -> p90 E2EL (s) of the rate points not marked saturated: the detector's ramp-up bound at higher rates
        self._service_times: dict[float, float] = {}

    def __enter__(self) -> Sweeper:
        return self.open()

    def open(self, wait: bool = True) -> Sweeper:
        """Check the workload, calibrate, open the run directory and start the server (or check the URL). With
        `wait=False` a launched server is only spawned, and `wait_ready` must follow before measuring."""
        cfg = self.config
        from engine.tokenizer import get_tokenizer

        with self.console.status(f"loading tokenizer {cfg.tokenizer or cfg.model}"):
            self.tokenizer = get_tokenizer(cfg.tokenizer or cfg.model)
        build_prompts(cfg.workload, self.tokenizer, 1, salt="check")  # a bad workload fails before any file exists
        check_slo_classes(cfg.workload, cfg.slo, cfg.num_prompts, self.tokenizer)  # ... and an SLO class it lacks
        if cfg.workload.conversations is not None:
            from workloads.conversations import load_conversations

            load_conversations(cfg.workload.conversations)  # parsed once; a bad file fails here too
        if cfg.url is not None:
            check_reachable(cfg.url, cfg.api_key)
        if cfg.calibration and self.calibration is None:
            self.calibration = calibrate(self.console)
        previous = cfg.output_dir / results.CONFIG
        if cfg.resume and previous.exists():
            self.salt = json.loads(previous.read_text()).get("workload", {}).get("salt", self.salt)
        self.writer = results.open_run(cfg.output_dir, self.run_config(url=cfg.url), resume=cfg.resume)
        url = cfg.url
        if url is None:
            self.server = launch(
                cfg.model,
                cfg.engine_knobs,
                cfg.output_dir / results.SERVER_LOG,
                template=cfg.launch_template,
                health_timeout_s=cfg.health_timeout_s,
                health_path=cfg.health_path,
            )
            self.server.spawn()
            if wait:
                self.wait_ready()
            return self
        self._connect(url)
        return self

    def wait_ready(self) -> None:
        """Wait until the spawned server is healthy (stopping it if it never is); record its URL."""
        assert self.server is not None and self.writer is not None
        with self.console.status(f"starting the engine ({self.config.model}); log {self.server.log_path}"):
            try:
                self.server.wait_healthy()
            except BaseException:
                self.server.stop()
                raise
        self.writer.config["target"]["url"] = self.server.url
        self.writer.save_config()
        self._connect(self.server.url)

    def _connect(self, url: str) -> None:
        cfg = self.config
        self.client = ClientConfig(
            url=url,
            model=cfg.model,
            endpoint=cfg.workload.endpoint,
            api_key=cfg.api_key,
            ignore_eos=cfg.ignore_eos,
            temperature=cfg.temperature,
            request_timeout_s=cfg.request_timeout_s,
            stall_timeout_s=cfg.stall_timeout_s,
        )

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.stop()

    def run_config(self, url: str | None) -> dict[str, Any]:
        cfg = self.config
        target = {
            "url": url,
            "model": cfg.model,
            "tokenizer": cfg.tokenizer or cfg.model,
            "backend": "servelab" if cfg.url is None and cfg.launch_template is None else "openai",
            "engine_knobs": dict(cfg.engine_knobs),
            "launch_template": cfg.launch_template,
        }
        if cfg.weights is not None:
            target["weights"] = cfg.weights
        return run_config(
            cfg, cfg.output_dir, self.salt, cfg.command, target, cfg.measurement_record(), calibration=self.calibration
        )

    def point_spec(self, value: float) -> PointSpec:
        cfg = self.config
        if cfg.mode == "rate":
            value = round(value, 2)  # the label's precision: a label always names exactly one rate
            if value <= 0:
                raise ValueError("request rates below 0.01 req/s are not supported")
        if cfg.mode == "replay":
            return PointSpec(
                label=cfg.label(value),
                mode="replay",
                concurrency=cfg.max_concurrency,
                num_prompts=cfg.num_prompts,
                duration=cfg.duration,
                num_warmups=cfg.num_warmups,
                time_scale=value,
                cancel=cfg.cancel,
            )
        return cfg.point_spec(
            value,
            num_warmups=cfg.num_warmups,
            ramp=cfg.ramp_up,
            turns=cfg.turns,
            think_time_s=cfg.think_time_s,
            rate_curve=tuple(cfg.rate_curve) if cfg.rate_curve is not None else None,
            cancel=cfg.cancel,
        )

    def measure(self, value: float, repeat: int = 0) -> dict[str, Any]:
        """Run one point (or reload it when a resumed run already has it) and return its point dict.
        `repeat` > 0 measures the load again under its own label (`<label>-rep<r>`)."""
        assert self.writer is not None and self.client is not None, "use `with Sweeper(config) as sweeper:`"
        spec = self.point_spec(value)
        if repeat:
            spec.label = f"{spec.label}-rep{repeat}"
        if spec.label in self.writer.finished_labels():
            point = self.writer.load_point(spec.label)
            self.console.print(f"[dim]{spec.label}: already measured, kept[/dim]")
            self._print_row(point)
            self._note_service_time(point)
            return point
        run = self._run_point(spec)
        self._check_server_alive()
        point = self.point_dict(run)
        self._note_service_time(point)
        if run.extras.get("pool_exhausted"):
            self.console.print(
                f"[yellow]{spec.label}: all {len(run.prompts)} prompts were sent before --duration ended; "
                "pass a larger --num-prompts for the pool[/yellow]"
            )
        if point.get("not_sent"):
            self.console.print(
                f"[yellow]{spec.label}: {point['not_sent']} requests were due but never sent (still waiting for a "
                "--max-concurrency slot when --duration ended); they count as SLO misses[/yellow]"
            )
        if point.get("cancelled"):
            self.console.print(f"[dim]{spec.label}: {point['cancelled']} requests cancelled by the client "
                               "(--cancel-rate); neither completed nor failed[/dim]")
        self.writer.write_point(point, [r.to_row(spec.label) for r in run.records])
        self._print_row(point)
        if self.server is None and point["failed"] and not point.get("saturation", {}).get("stopped"):
            check_target_healthy(self.client.url, spec.label, point["failed"])
        return point

    def _run_point(self, spec: PointSpec, title: str | None = None) -> PointRun:
        assert self.client is not None
        total = spec.num_prompts if spec.num_prompts is not None or spec.mode == "replay" else spec.pool_size
        with Progress(
            TextColumn(f"[bold]{title or spec.label}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            refresh_per_second=4,
        ) as progress:
            task = progress.add_task(spec.label, total=total)
            return run_point(
                self.client,
                spec,
                self.config.workload,
                self.tokenizer,
                salt=self.salt,
                reset_cache=self.config.reset_prefix_cache,
                client_procs=self.config.client_procs,
                on_done=lambda: progress.advance(task),
                server_metrics=self.config.server_metrics,
                saturation=self._saturation_config(spec.rate),
            )

    def _saturation_config(self, rate: float) -> SaturationConfig:
        """The detector's constants, with this point's reference service time (sweep.point.saturation)."""
        reference = reference_for(self._service_times, rate)
        return replace(self.config.saturation, reference_service_s=reference)

    def _note_service_time(self, point: dict[str, Any]) -> None:
        evidence = point.get("saturation") or {}
        if saturated_verdict(point) is not True and evidence.get("service_p90_s"):
            self._service_times[float(point["request_rate"])] = float(evidence["service_p90_s"])

    def measure_repeat(self, value: float, repeat: int) -> dict[str, Any]:
        """Run one repeat of one point (or reload it on resume); publishes the pooled point after its last repeat."""
        assert self.writer is not None and self.client is not None, "use `with Sweeper(config) as sweeper:`"
        spec = self.point_spec(value)
        if (spec.label, repeat) in self.writer.finished_repeats():
            self.console.print(f"[dim]{spec.label} repeat {repeat}: already measured, kept[/dim]")
            point = self.writer.load_repeat(spec.label, repeat)
        else:
            run = self._run_point(spec, title=f"{spec.label} r{repeat}")
            self._check_server_alive()
            point = self.point_dict(run)
            self.writer.write_repeat(point, repeat, [r.to_row(spec.label) for r in run.records])
            if self.server is None and point["failed"]:
                check_target_healthy(self.client.url, f"{spec.label} repeat {repeat}", point["failed"])
        self._note_service_time(point)
        self._print_row({**point, "label": f"{spec.label}.r{repeat}"})
        done = self.writer.finished_repeats()
        if spec.label not in self.writer.finished_labels() and all(
            (spec.label, k) in done for k in range(self.config.repeats)
        ):
            repeats = [self.writer.load_repeat(spec.label, k) for k in range(self.config.repeats)]
            pooled = pooled_point(
                repeats,
                self.writer.load_rows(spec.label),
                self.config.percentiles,
                self.config.slo,
                queue_inclusive=queue_inclusive_applies(spec.concurrency, spec.rate),
            )
            rows = self.writer.load_rows(spec.label)
            self._add_cost(pooled, [RequestRecord.from_row(row) for row in rows], float(pooled["duration"]))
            self.writer.write_point(pooled, [])
            self._print_row(pooled)
        return point

    def _add_cost(self, point: dict[str, Any], records: list[RequestRecord], duration: float) -> None:
        """With --cost-per-hour: the point's cost per million output tokens at its goodput (sweep/run/cost.py)."""
        if self.config.cost_per_hour is None:
            return
        from sweep.run.cost import CostConfig, cost_fields, occupied_devices

        cfg = self.config
        # An engine launched here occupies what its knobs say; a --url target what its caller says (None: the
        # whole instance).
        devices = occupied_devices(cfg.engine_knobs) if cfg.url is None else cfg.devices_used
        cost = CostConfig(cfg.cost_per_hour, cfg.gpus_per_instance)
        point.update(cost_fields(records, duration, cfg.slo, cost, devices_used=devices))

    def _check_server_alive(self) -> None:
        """A launched engine that died mid-point fails the sweep (with its log) instead of recording failures."""
        if self.server is None or self.server.process is None:
            return
        code = self.server.process.poll()
        if code is not None:
            raise RuntimeError(
                f"the engine exited with code {code} during the sweep; log {self.server.log_path}:\n"
                f"{self.server.log_tail()}"
            )

    def point_dict(self, run: PointRun) -> dict[str, Any]:
        spec = run.spec
        saturation = run.extras.pop("saturation", None)
        rate = run.extras.pop("replayed_rate", spec.rate)  # replay: the trace's offered rate at this time scale
        queue_inclusive = queue_inclusive_applies(spec.concurrency, rate)
        metrics = calculate_metrics(
            run.records, run.duration, self.config.percentiles, self.config.slo, queue_inclusive
        )
        point: dict[str, Any] = {
            "label": spec.label,
            "max_concurrency": spec.concurrency,
            "request_rate": rate,
            "burstiness": spec.burstiness,
            "num_prompts": sum(r.sent for r in run.records),
            **metrics,
        }
        cfg = self.config
        point.update(extra_point_fields(run, cfg.percentiles, cfg.slo, queue_inclusive))
        asked = point_window(run, cfg.warmup_seconds, cfg.cooldown_seconds, cfg.steady_window == "auto")
        if asked is not None and asked[0] is None:
            point["window"] = "full"
            reason = "no steady span was detected" if asked[1] == "auto" else (
                "it is shorter than --warmup-seconds + --cooldown-seconds")
            self.console.print(
                f"[yellow]{spec.label}: the point ran {run.duration:.1f} s and {reason}; its figures are over the "
                "whole point (window: full)[/yellow]"
            )
        elif asked is not None:
            window, rule = asked
            point = windowed_point(point, run.records, run.t0, window, rule, cfg.percentiles, cfg.slo, queue_inclusive)
        # The cost is over the reported figures' requests and time: the steady window's when there is one.
        in_window = point.get("window") == "steady"
        self._add_cost(point, [r for r in run.records if r.in_window] if in_window else run.records,
                       float(point["duration"]) if in_window else run.duration)
        point.update(saturation_fields(saturation))
        point["fidelity"] = {**workload_fidelity(run), "client": client_fidelity(run)}
        if run.fit_report is not None:  # --max-model-len changed the workload: say how
            point["fidelity"]["fit"] = asdict(run.fit_report)
        return point

    def _print_row(self, point: dict[str, Any]) -> None:
        p = percentile_name(max(self.config.percentiles))
        if not self._header_printed:
            self.console.print(results.console_header(p), soft_wrap=True)
            self._header_printed = True
        self.console.print(results.console_row(point, p), soft_wrap=True)
        if is_saturated(point):
            self.console.print(f"[red]{saturation_message(point)}[/red]")
        elif note := not_judged_message(point):
            self.console.print(f"[yellow]{note}[/yellow]")

    def search(self) -> SearchResult:
        """The --max-load-under-slo search (sweep/run/search.py): each probe measured --repeats times, an
        uncertain one up to --search-repeats more (points `<label>-rep<r>`), verdicts at --confidence."""
        cfg = self.config
        assert self.writer is not None
        config = SearchConfig(mode=cfg.mode, start=cfg.values[0], attainment=cfg.attainment, max_value=cfg.max_load,
                              confidence=cfg.confidence, repeats=cfg.repeats, extra_repeats=cfg.search_repeats)
        result = max_load_under_slo(config, lambda value, r: point_counts(self.measure(value, r)))
        search = search_record(result, cfg.label)
        fixed = cfg.warmup_seconds or cfg.cooldown_seconds
        rule = "auto" if cfg.steady_window == "auto" else "fixed" if fixed else None  # probes judged by windows
        search.update(slo=cfg.slo, steady_window=rule)
        self.writer.write_search(search)
        unit = "streams" if cfg.mode == "concurrency" else "req/s"
        self.console.print(answer_text(result, unit, len(search["labels"])))
        return result

    def run(self) -> list[dict[str, Any]]:
        if self.config.max_load_under_slo:
            self.search()
            assert self.writer is not None
            return [self.writer.load_point(label) for label in sorted(self.writer.finished_labels())]
        if self.config.repeats > 1:
            for repeat, value in repeat_order(self.config.values, self.config.repeats):
                self.measure_repeat(value, repeat)
            assert self.writer is not None
            return [self.writer.load_point(self.config.label(value)) for value in self.config.values]
        return self.run_loads()

    def run_loads(self) -> list[dict[str, Any]]:
        """Measure every configured load; with --stop-when-saturated, loads above a saturated one are skipped
        (said on the console and listed in skipped.json, which the report shows)."""
        assert self.writer is not None
        points: list[dict[str, Any]] = []
        skipped: list[dict[str, Any]] = []
        saturated: tuple[float, str] | None = None  # the lowest load that saturated, and its label
        for value in self.config.values:
            if saturated is not None and value > saturated[0]:
                label = self.config.label(value)
                reason = f"skipped: a lower load ({saturated[1]}) saturated (--stop-when-saturated)"
                skipped.append({"label": label, "request_rate": value, "reason": reason})
                self.console.print(f"[yellow]{label}: {reason}[/yellow]")
                continue
            points.append(self.measure(value))
            if self.config.saturation.stop and is_saturated(points[-1]) and (saturated is None or value < saturated[0]):
                saturated = (value, points[-1]["label"])
        self.writer.write_skipped(skipped)
        return points


def run_sweep(config: SweepConfig, console: Console | None = None) -> Path:
    """Run a whole sweep; returns the run directory."""
    with Sweeper(config, console) as sweeper:
        sweeper.run()
    return config.output_dir
