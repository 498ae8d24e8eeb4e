#!/usr/bin/env bash
# `make bench`: CPU decode/prefill throughput of the 1b-shape Q4_K_M model
# (dim 2048, 16 layers, 32/8 heads, FFN 8192, vocab 32000) against this
# machine's streaming-read bandwidth, measured in the same run.
#   - makes models/synth-1b-q4km.gguf with spillway-synth if it is absent
#     (random weights: the speed is real, the text would be gibberish);
#   - THREADS (default 2, the issue's setting), PROMPT (512), GEN (128),
#     BATCHES (1,4,16), DEPTH (0: positions of context before prefill and
#     decode) and KV_CACHE (f16, or q8_0) override the defaults;
#   - BENCH_JSON=FILE also keeps the JSON line.
set -euo pipefail
cd "$(dirname "$0")/.."
. ops/bench-common.sh

out=$("$BIN/spillway-bench" -m "$MODEL" -t "$THREADS" -p "$PROMPT" -n "$GEN" -b "$BATCHES" \
  -d "$DEPTH" --kv-cache "${KV_CACHE:-f16}")
echo "$out"
if [ -n "${BENCH_JSON:-}" ]; then
  echo "$out" | tail -n 1 > "$BENCH_JSON"
fi
