"""What the engine's own commands need: `bench throughput` and its `--vary`, `bench model prepare`, `bench check gpu`
(with the kernel checks) and `bench check quality`, and `python -m engine.benchmarks.scheduler_cost`."""
