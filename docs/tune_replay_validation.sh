#!/bin/bash
# `bench tune --simulate-first` against the full grid (docs/benchmarks-history.md, "bench simulate" section, "Tuning-grid
# replay"): one profile, then the whole grid launched (`bench tune --grid`: every configuration once, which records
# the grid and its true best), then the same grid with --simulate-first in the same order (GridSampler, same
# seed), then the whole grid once more (the run-to-run spread of the same configurations). One locked run:
#   flock /work/bench.lock docs/tune_replay_validation.sh OUT_DIR
# SLO=ttft=...,tpot=... overrides the SLO (default ttft=3000,tpot=150); RERUN=0 skips the second full grid.
# Afterwards (no timing): bench lab tune-launches OUT/full simfirst=OUT/simfirst rerun=OUT/full2
set -euo pipefail
O=${1:?usage: tune_replay_validation.sh OUT_DIR}
mkdir -p "$O"
B="env OMP_NUM_THREADS=1 PYTHONPATH=$PWD ${PYTHON:-/work/main/.venv/bin/python} cli.py"
log() { echo "$(date -u +%H:%M:%S) $* | $(uptime | sed 's/.*load/load/')" | tee -a "$O/log.txt"; }
# 3 x 2 x 2 = 12 configurations; chunked prefill off with a 256-token budget breaks vLLM's rule
# (max_num_batched_tokens >= max_model_len), so 3 of them are infeasible without a launch in every study.
cat > "$O/space.yaml" <<'YAML'
max_num_seqs: {choices: [2, 4, 8]}
max_num_batched_tokens: {choices: [256, 1024]}
enable_chunked_prefill: {choices: [true, false]}
max_model_len: 1024
block_size: null
enable_prefix_caching: null
speculative_config: null
gpu_memory_utilization: null
YAML
# Goodput (good requests/s) at 8 closed-loop streams, random 256-token prompts and 32 output tokens, 16 requests.
T="tune --model smollm2-135m --space $O/space.yaml --grid --seed 0 --objective goodput --slo ${SLO:-ttft=3000,tpot=150} \
  --workload random --input-len 256 --output-len 32 --concurrency 8 --num-prompts 16 --num-warmups 1 \
  --startup-timeout 120 --trial-timeout 300"
log start "slo ${SLO:-ttft=3000,tpot=150}"
$B profile --prefill-tokens 16,64,256,1024 --decode-seqs 1,4,8 --context-lens 128,512 --repeats 3 \
  --max-model-len 2048 --output "$O/profile.json" | tee "$O/profile.txt"
log profile done
$B $T --output-dir "$O/full" 2>&1 | tee "$O/full.txt"
log full grid done
$B $T --simulate-first "$O/profile.json" --output-dir "$O/simfirst" 2>&1 | tee "$O/simfirst.txt"
log simulate-first done
if [ "${RERUN:-1}" != 0 ]; then
  $B $T --output-dir "$O/full2" 2>&1 | tee "$O/full2.txt"
  log full grid rerun done
fi
