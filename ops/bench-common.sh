# Sourced by ops/bench.sh and ops/bench-peers.sh: the settings both take from
# the environment, and the 1b-shape Q4_K_M file both run, made once.
BIN=${SPILLWAY_BIN:-build/bin}
MODEL=${BENCH_MODEL:-models/synth-1b-q4km.gguf}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-512}
GEN=${GEN:-128}
BATCHES=${BATCHES:-1,4,16}
DEPTH=${DEPTH:-0}      # positions of context before the prefill and the decode

if [ ! -f "$MODEL" ]; then
  mkdir -p "$(dirname "$MODEL")"
  echo "bench: making $MODEL (1b shape, q4_k_m, random weights; takes a few minutes)" >&2
  "$BIN/spillway-synth" --shape 1b --type q4_k_m "$MODEL.tmp"
  mv "$MODEL.tmp" "$MODEL"
fi
