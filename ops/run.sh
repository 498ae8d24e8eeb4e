#!/usr/bin/env bash
# `make run`: serve the default setup until Ctrl-C.
#   - makes the demo model with spillway-synth if it is absent (RANDOM WEIGHTS:
#     it exercises the whole system at realistic speed but writes gibberish);
#   - MODEL=path/to/model.gguf serves your own model instead, named after the file;
#   - starts the gateway and one CPU worker, plus a GPU worker when nvidia-smi
#     finds a GPU; stops them all cleanly on Ctrl-C;
#   - the admin API's token is $STATE/admin.token (default build/run), made
#     once with mode 0600 if absent; ADMIN_TOKEN_FILE=path uses yours.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${SPILLWAY_BIN:-build/bin}
HTTP=${HTTP:-127.0.0.1:8080}
WORKERS=${WORKERS:-tcp://127.0.0.1:5555}
THREADS=${THREADS:-$(nproc)}
STATE=${STATE:-build/run}
ADMIN_TOKEN_FILE=${ADMIN_TOKEN_FILE:-$STATE/admin.token}

if [ -n "${MODEL:-}" ]; then
  [ -f "$MODEL" ] || { echo "run: MODEL=$MODEL: no such file" >&2; exit 1; }
  NAME=$(basename "$MODEL" .gguf)
  CONFIG=$STATE/routes.yaml
  # Same shape as routes.yaml, for the user's model name.
  mkdir -p "$STATE"
  sed "s/\"demo\"/\"$NAME\"/g" routes.yaml > "$CONFIG"
else
  MODEL=models/demo-125m-q4_k_m.gguf
  NAME=demo
  CONFIG=routes.yaml
  if [ ! -f "$MODEL" ]; then
    mkdir -p models
    echo "run: making the demo model $MODEL (random weights, for demonstration only)"
    "$BIN/spillway-synth" --shape 125m --type q4_k_m "$MODEL"
  fi
fi

# The admin token: a secret, so made private from the start (umask), never
# printed, and never overwritten once it exists.
if [ ! -e "$ADMIN_TOKEN_FILE" ]; then
  mkdir -p "$(dirname "$ADMIN_TOKEN_FILE")"
  (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$ADMIN_TOKEN_FILE"; echo >> "$ADMIN_TOKEN_FILE")
  echo "run: made the admin token $ADMIN_TOKEN_FILE (mode 0600)"
fi

pids=()
stop() {
  trap - INT TERM EXIT
  echo; echo "run: stopping"
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  exit 0
}
trap stop INT TERM EXIT

"$BIN/spillway-gateway" --config "$CONFIG" --http "$HTTP" --workers "$WORKERS" \
  --admin-token-file "$ADMIN_TOKEN_FILE" & pids+=($!)
"$BIN/spillway-worker-cpu" --gateway "$WORKERS" --pool cpu-pool --model "$NAME=$MODEL" --threads "$THREADS" & pids+=($!)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  "$BIN/spillway-worker-gpu" --gateway "$WORKERS" --pool gpu-pool --model "$NAME=$MODEL" & pids+=($!)
else
  echo "run: no GPU found: the gpu-pool route is degraded, so requests spill over to cpu-pool"
fi

port=${HTTP##*:}
cat <<MSG

Spillway is serving model "$NAME" at http://localhost:$port/v1
  curl http://localhost:$port/v1/completions -H 'Content-Type: application/json' \\
       -d '{"model": "$NAME", "prompt": "Once upon a time", "max_tokens": 32}'
  dashboard: http://localhost:$port/dashboard (asks for the admin token below)
  metrics:   http://localhost:$port/metrics               Ctrl-C stops everything.
  admin API (token in $ADMIN_TOKEN_FILE):
  curl http://localhost:$port/admin/status -H "Authorization: Bearer \$(cat $ADMIN_TOKEN_FILE)"

MSG
wait -n "${pids[@]}" || true
echo "run: a process exited; stopping the rest" >&2
stop
