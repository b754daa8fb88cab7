"""Studies of the engine itself, each behind a `bench lab` command, and the old side-by-side studies the hidden
aliases throughput-tp, decode-speed and spec-decode still run (their new spelling is `bench throughput --vary`)."""
