"""`bench tune`'s workload and load checks: every trial measures the load a `bench sweep` with the same flags would,
and a flag that cannot work is one clear error before any trial, never a failure in every trial.

The load shapes are the sweep's (sweep.run.load_shape.LoadShape: sessions, replay, rate curves, structured
outputs; and `--duration`), carried into each trial's sweep by `TrialWorkload` (sweep/tune/backend.py). Where a
shape does not fit an objective it is refused by name (`tune_load`):

- `--replay` sends the trace at its own timestamps: there is no load for `--objective max-load` to search, so a
  replay is tuned with goodput, pareto or cost, at one `--time-scale`.
- `--ramp-up-strategy` is one point whose rate ramps from its start to its end rate: max-load cannot scale it
  either (a `--rate-curve` can: it is rescaled to each point's mean rate, so the search moves that rate).
- `--simulate-first` (`check_simulated_shape`): the simulator models closed and open loops of single requests
  (with `--duration`), not sessions, replays, ramps, rate curves or structured outputs, so it refuses those.
  The quality guard (`--max-quality-loss`) scores a text, not the load, so it takes every shape.

`check_trial_sweep` builds the sweep one trial would run (its SweepConfig and its point), so the sweep's own checks
(`--turns` needs `--endpoint chat`, ...) run once here, and reads the conversation file and the structured-output
kind. `study_longest_request` feeds the max_model_len floor (sweep/tune/workload_lengths.py) with the requests the
study's points send: sessions' histories included.
"""

from __future__ import annotations

from pathlib import Path

from sweep.run.load_shape import LoadShape
from sweep.tune.backend import TrialWorkload
from sweep.tune.objective import REPLAY_MAX_LOAD, ObjectiveSpec

RAMP_MAX_LOAD = (
    "--ramp-up-strategy is one point whose rate ramps from --ramp-up-start-rps to --ramp-up-end-rps, so "
    "--objective max-load has no load to search; tune a ramp with --objective goodput, pareto or cost (or use "
    "--request-rate with --rate-curve, which max-load scales)"
)


def check_workload(workload: str, input_len: int | None, output_len: int | None, seed: int) -> None:
    """A bad workload or length option is one clear error before any trial, not a failure in every trial."""
    import workloads

    if workloads.prompt_files.is_prompt_workload(workload):  # its file is checked; longest_request measures its text
        try:
            workloads.prompt_files.read_prompt_file(workload)
        except FileNotFoundError as error:
            raise ValueError(str(error)) from None
    elif workloads.text_mixtures.is_text_mixture(workload):
        workloads.text_mixtures.check_text_mixture(workload, seed)
    elif workload not in workloads.TEXT_WORKLOADS and (
        workload in workloads.shipped_names() or not Path(workload).expanduser().is_file()
    ):
        workloads.load(workload, num_requests=1, seed=seed, input_len=input_len, output_len=output_len)


def tune_load(objective: str, concurrency: int | None, request_rate: float | None,
              shape: LoadShape) -> tuple[str, float | None]:
    """The study's load mode and the load given (None: the objective's default), from --concurrency,
    --request-rate and the shape; a ValueError names the flags that do not fit."""
    ramp = shape.ramp(concurrency, request_rate)
    if shape.replay:
        if concurrency is not None or request_rate is not None:
            raise ValueError("--replay sends the trace at its timestamps; drop --concurrency/--request-rate "
                             "(--time-scale sets its speed)")
        if objective == "max-load":
            raise ValueError(REPLAY_MAX_LOAD)
        try:
            (scale,) = [float(part) for part in shape.time_scale.split(",")]
        except ValueError:
            raise ValueError(f"--time-scale takes one number > 0 in a tune (every trial replays the trace at it), "
                             f"got {shape.time_scale!r}") from None
        return "replay", scale
    if shape.time_scale != LoadShape().time_scale:
        raise ValueError("--time-scale sets a --replay's speed; give --replay, or drop --time-scale")
    if ramp is not None:
        if objective == "max-load":
            raise ValueError(RAMP_MAX_LOAD)
        return "rate", ramp[2]
    if concurrency is not None and request_rate is not None:
        raise ValueError("give --concurrency or --request-rate, not both")
    if shape.rate_curve is not None and request_rate is None:
        raise ValueError("--rate-curve shapes --request-rate points; give --request-rate (the fixed rate, or the "
                         "max-load search's start)")
    if request_rate is not None:
        return "rate", request_rate
    return "concurrency", concurrency


def check_simulated_shape(shape: LoadShape) -> None:
    """--simulate-first: a ValueError naming the shape flags the simulator cannot model."""
    if given := shape.given():
        raise ValueError(
            f"--simulate-first: the simulator models closed and open loops of single requests (with --duration), not "
            f"{', '.join(given)}; drop {'them' if len(given) > 1 else 'it'} or --simulate-first"
        )


def check_trial_sweep(workload: TrialWorkload, load: float) -> None:
    """Build the sweep and the point a trial measures (every check of the sweep's), and read the conversation file
    and the structured-output kind, as the sweep would before its first point; a ValueError otherwise."""
    from sweep.run.sweeper import Sweeper
    from workloads.structured import make_constraint

    config = workload.sweep_config(Path("trial"), "http://127.0.0.1/v1", {})
    config.num_prompts = workload.prompts_for(load)
    Sweeper(config).point_spec(load)
    if workload.conversations is not None:
        from workloads.conversations import load_conversations

        try:
            load_conversations(workload.conversations)
        except FileNotFoundError as error:
            raise ValueError(str(error)) from None
    if workload.structured_output is not None or workload.structured_output_shape is not None:
        make_constraint(0, None, workload.structured_output or "json", workload.structured_output_shape,
                        workload.seed, workload.output_len)  # fmt: skip


def study_longest_request(workload: TrialWorkload, spec: ObjectiveSpec, tokenizer: str) -> int:
    """The longest request (prompt + output tokens) any point of the study sends: the max_model_len floor."""
    from sweep.tune.workload_lengths import longest_request, prompt_counts

    top = spec.max_load if spec.kind == "max-load" else spec.load  # the other objectives measure one load
    counts = prompt_counts(workload.num_prompts, spec.load_mode, spec.load, top, workload.duration, workload.turns)
    return longest_request(
        workload.workload, workload.input_len, workload.output_len, workload.seed, counts, tokenizer,
        workload.endpoint, turns=workload.turns, conversations=workload.conversations,
        sessions_counted=workload.num_prompts is None, replay=spec.load_mode == "replay",
    )  # fmt: skip
