#!/bin/bash
# `bench simulate` validation (docs/benchmarks-history.md, "bench simulate" section): one profile, two calibration sweeps
# and the validation sweeps, in one run under `flock /work/bench.lock` so they see the same machine:
#   flock /work/bench.lock docs/simulate_validation.sh OUT_DIR
# The predictions are made afterwards (simulation is deterministic, its timing is not measured):
#   bench lab profile-serving --profile OUT/profile.json --measured OUT/cal --measured OUT/cal_long \
#     --output OUT/profile_served.json
#   bench simulate --profile OUT/profile{,_served}.json <the same flags as each sweep below>
# Points are 8-30 requests (one request's order moved the medians of the old 4-12); ~8-11 minutes on a quiet
# machine, most of it the arXiv sweeps' long prompts and outputs.
set -euo pipefail
O=${1:?usage: simulate_validation.sh OUT_DIR}
mkdir -p "$O"
B="env OMP_NUM_THREADS=1 PYTHONPATH=$PWD ${PYTHON:-$PWD/.venv/bin/python} cli.py"
S="sweep --model smollm2-135m --num-warmups 1 --no-report"
log() { echo "$(date -u +%H:%M:%S) $* | $(uptime | sed 's/.*load/load/')" | tee -a "$O/log.txt"; }
log start
$B profile --prefill-tokens 16,64,256,1024,2048 --decode-seqs 1,4,16 --context-lens 128,512,1024 --repeats 3 \
  --max-model-len 4096 --output "$O/profile.json" | tee "$O/profile.txt"
log profile done
# Calibration (fits the serving terms and the hand-over): random 128/32 at 1 and 8 streams, default knobs; then
# 1024-token prompts at 4 streams, handed over one by one (a few us a prompt token): the per-token term.
$B $S --workload random --input-len 128 --output-len 32 --concurrency 1,8 --num-prompts 16 --output-dir "$O/cal"
log cal done
$B $S --workload random --input-len 1024 --output-len 4 --max-model-len 2048 --concurrency 4 --num-prompts 8 \
  --output-dir "$O/cal_long"
log cal_long done
# V1 LMSYS, defaults (max_num_seqs 256, 2048-token budget, chunked prefill), 4 streams.
$B $S --workload lmsys --max-model-len 2048 --concurrency 4 --num-prompts 30 --output-dir "$O/v1"
log v1 done
# V2 LMSYS, max_num_seqs 4 and a 512-token budget at 8 streams (half the streams queue).
$B $S --workload lmsys --max-model-len 2048 --max-num-seqs 4 --max-num-batched-tokens 512 --concurrency 8 \
  --num-prompts 30 --output-dir "$O/v2"
log v2 done
# V3 long prompts (arXiv summarisation), chunked prefill off, 2 streams.
$B $S --workload arxiv-summarization --max-model-len 2048 --no-enable-chunked-prefill \
  --max-num-batched-tokens 2048 --concurrency 2 --num-prompts 8 --output-dir "$O/v3"
log v3 done
# V4 long prompts, chunked prefill in 256-token chunks, 3 streams.
$B $S --workload arxiv-summarization --max-model-len 2048 --max-num-batched-tokens 256 --concurrency 3 \
  --num-prompts 12 --output-dir "$O/v4"
log v4 done
