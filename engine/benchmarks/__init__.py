"""Offline benchmarks of the engine (`bench throughput`)."""
