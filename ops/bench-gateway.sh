#!/usr/bin/env bash
# `make bench-gateway` (which builds first): what the gateway costs, on loopback.
#
# Everything runs on this machine and shares its cores (on a machine with more
# than 2, it is all pinned to 2 with taskset, the size the targets are set
# for): spillway-loadgen, the gateway, and spillway-worker-cpu in --test-echo
# mode (no model, placeholder tokens at a fixed rate), so what is measured is
# the gateway's own overhead, not a model.
#
#   (a) direct baseline: spillway-loadgen --direct plays the gateway's part of
#       the worker protocol and keeps 256 streams in flight on 2 echo workers;
#   (b) the same 256 streams through the gateway (HTTP + SSE). Added latency =
#       (b) - (a), at p50 and p99, for the whole request and for the first token.
#       (a) and (b) alternate over ROUNDS rounds and percentiles are taken over
#       the pooled samples, so background load on a shared machine hits both;
#   (c) maximum requests/s: short non-streaming requests (max_tokens 1) from 64
#       keep-alive connections for RPS_SECONDS.
# Also reads the gateway's own spillway_gateway_added_latency_seconds histogram.
# Prints a table and one JSON line. Targets: p99 added < 1 ms at 256 streams,
# >= 10,000 requests/s. Exit 0 when every phase ran without failed requests
# (whether or not the targets are met; STRICT=1 also fails on a missed target),
# 1 otherwise.
#
# Knobs (environment): STREAM_RATE tokens/s per stream (50), STREAM_TOKENS (16),
# STREAM_SECONDS per side (10), ROUNDS (2), STREAMS (256), RPS_CONCURRENCY (64), RPS_SECONDS (10),
# BENCH_CPUS (taskset list, default 0,1 when there are more than 2 CPUs;
# "none" = no pinning), KEEP_LOGS=1.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${SPILLWAY_BIN:-${SPILLWAY_BUILD:-${B:-build}}/bin}
STREAM_RATE=${STREAM_RATE:-50}
STREAM_TOKENS=${STREAM_TOKENS:-16}
STREAM_SECONDS=${STREAM_SECONDS:-10}   # per side, split over ROUNDS alternating rounds
ROUNDS=${ROUNDS:-2}
STREAMS=${STREAMS:-256}
RPS_CONCURRENCY=${RPS_CONCURRENCY:-64}
RPS_SECONDS=${RPS_SECONDS:-10}
FAST_RATE=1000000      # tokens/s: the rps workers are never the bottleneck
WORKER_SLOTS=512       # per worker: 2 x 512 > 256 streams, so nothing queues there
PY=$(command -v python3 || echo .venv/bin/python)

for b in spillway-gateway spillway-worker-cpu spillway-loadgen; do
  [ -x "$BIN/$b" ] || { echo "bench-gateway: $BIN/$b is not built (run: make bench-gateway)" >&2; exit 1; }
done
for v in STREAM_RATE STREAM_TOKENS STREAM_SECONDS ROUNDS STREAMS RPS_CONCURRENCY RPS_SECONDS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench-gateway: $v='${!v}' is not a positive whole number" >&2; exit 1; }
done

# Pin to 2 CPUs where there are more, so the figures mean the same everywhere.
PIN=()
ncpu=$(nproc)
cpus=${BENCH_CPUS:-$([ "$ncpu" -gt 2 ] && echo 0,1 || echo none)}
if [ "$cpus" != none ] && command -v taskset >/dev/null; then
  PIN=(taskset -c "$cpus")
else
  cpus="all $ncpu"
fi

LOGS=$(mktemp -d /tmp/spillway-bench-gateway.XXXXXX)
pids=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  if [ "$rc" -eq 0 ] && [ -z "${KEEP_LOGS:-}" ]; then rm -rf "$LOGS"
  else echo "bench-gateway: logs in $LOGS" >&2; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_echo NAME ENDPOINT POOL MODEL RATE: a test-mode worker in the background.
start_echo() {
  SPILLWAY_ALLOW_TEST_MODE=1 "${PIN[@]}" "$BIN/spillway-worker-cpu" --gateway "$2" --pool "$3" \
    --model "$4=/dev/null" --test-echo "$5" --parallel "$WORKER_SLOTS" >"$LOGS/$1.log" 2>&1 &
  pids+=($!)
}

# Stops one of ours and forgets it, so cleanup never signals a reused pid.
stop_pid() {
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  local keep=() p
  for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  pids=("${keep[@]}")
}

# loadgen NAME ARGS...: runs it, keeps its JSON line in $LOGS/NAME.json.
loadgen() {
  local name=$1; shift
  if ! "${PIN[@]}" "$BIN/spillway-loadgen" "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.err"; then
    echo "bench-gateway: phase '$name' had failed requests:" >&2
    cat "$LOGS/$name.out" "$LOGS/$name.err" >&2
    exit 1
  fi
  tail -n 1 "$LOGS/$name.out" >"$LOGS/$name.json"
}

# One stream lasts STREAM_TOKENS/STREAM_RATE s; starting the 256 loops over that
# long puts the streams at every phase, as real traffic would, instead of in lockstep.
RAMP=$("$PY" -c "print($STREAM_TOKENS / $STREAM_RATE)")
ROUND_SECONDS=$("$PY" -c "print(max($STREAM_SECONDS / $ROUNDS, 1.0))")
STREAM_ARGS=(--concurrency "$STREAMS" --duration "$ROUND_SECONDS" --max-tokens "$STREAM_TOKENS"
             --ramp "$RAMP" --timeout 30)

echo "bench-gateway: binaries from $BIN, CPUs: $cpus, logs: $LOGS"

# ---- the gateway and its workers ------------------------------------------
HTTP_PORT=$(free_port)
WORKERS_EP="tcp://127.0.0.1:$(free_port)"
BASE="http://127.0.0.1:$HTTP_PORT"
cat >"$LOGS/routes.yaml" <<'YAML'
# bench-gateway: paced streams on one pool, instant replies on the other.
pools:
  - name: stream-pool
    kind: cpu
  - name: fast-pool
    kind: cpu
routes:
  - model: "echo-stream"
    target: stream-pool
  - model: "echo"
    target: fast-pool
defaults:
  queue_length: 4096
YAML
"${PIN[@]}" "$BIN/spillway-gateway" --config "$LOGS/routes.yaml" --http "127.0.0.1:$HTTP_PORT" \
  --workers "$WORKERS_EP" --sdk none >"$LOGS/gateway.log" 2>&1 &
pids+=($!)
start_echo gw-stream-w1 "$WORKERS_EP" stream-pool echo-stream "$STREAM_RATE"
start_echo gw-stream-w2 "$WORKERS_EP" stream-pool echo-stream "$STREAM_RATE"
start_echo gw-fast-w1 "$WORKERS_EP" fast-pool echo "$FAST_RATE"
start_echo gw-fast-w2 "$WORKERS_EP" fast-pool echo "$FAST_RATE"

# Ready when /healthz counts all 4 workers.
"$PY" - "$BASE" <<'PY' || { echo "bench-gateway: the gateway did not come up with 4 workers:" >&2; tail -n 20 "$LOGS/gateway.log" >&2; exit 1; }
import json, sys, time, urllib.request
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(sys.argv[1] + "/healthz", timeout=2) as r:
            if json.load(r).get("workers", 0) >= 4:
                sys.exit(0)
    except Exception:
        pass
    time.sleep(0.1)
sys.exit(1)
PY

scrape() { "$PY" -c 'import sys,urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]+"/metrics",timeout=5).read().decode())' "$BASE" >"$LOGS/$1.prom" 2>/dev/null || : >"$LOGS/$1.prom"; }

loadgen warmup-stream --http "127.0.0.1:$HTTP_PORT" --model echo-stream --stream \
  --concurrency "$STREAMS" --requests "$STREAMS" --max-tokens 2 --timeout 30
scrape before-stream

# ---- (a) direct and (b) through the gateway, alternating ---------------------
# Rounds alternate so that both sides see the same machine: a burst of other
# work on a shared box would otherwise land on one side only. Percentiles are
# taken over the pooled samples of all rounds.
echo "bench-gateway: streams: $STREAMS x $STREAM_TOKENS tokens at $STREAM_RATE tokens/s, $ROUNDS rounds of ${ROUND_SECONDS}s direct + gateway"
for round in $(seq "$ROUNDS"); do
  # (a) direct baseline: fresh workers on a fresh endpoint each round.
  DIRECT_EP="tcp://127.0.0.1:$(free_port)"
  start_echo "direct$round-w1" "$DIRECT_EP" bench echo-stream "$STREAM_RATE"; dw1=$!
  start_echo "direct$round-w2" "$DIRECT_EP" bench echo-stream "$STREAM_RATE"; dw2=$!
  loadgen "direct$round" --direct "$DIRECT_EP" --model echo-stream --workers 2 --wait 15 \
    --samples "$LOGS/direct$round.samples" "${STREAM_ARGS[@]}"
  stop_pid "$dw1"; stop_pid "$dw2"
  # (b) the same streams over HTTP/SSE through the gateway.
  loadgen "gateway$round" --http "127.0.0.1:$HTTP_PORT" --model echo-stream --stream \
    --samples "$LOGS/gateway$round.samples" "${STREAM_ARGS[@]}"
done
scrape after-stream

# ---- (c) max requests/s -------------------------------------------------
echo "bench-gateway: rps: $RPS_CONCURRENCY connections, max_tokens 1, non-streaming, ${RPS_SECONDS}s"
loadgen warmup-rps --http "127.0.0.1:$HTTP_PORT" --model echo --concurrency "$RPS_CONCURRENCY" \
  --duration 1 --max-tokens 1
scrape before-rps
loadgen rps --http "127.0.0.1:$HTTP_PORT" --model echo --concurrency "$RPS_CONCURRENCY" \
  --duration "$RPS_SECONDS" --max-tokens 1 --timeout 30
scrape after-rps

# ---- report -----------------------------------------------------------------
"$PY" - "$LOGS" "$cpus" "${STRICT:-}" "$ROUNDS" <<'PY'
import json, math, re, sys
logs, cpus, strict, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
P99_TARGET_MS, RPS_TARGET = 1.0, 10000.0

def load(name):
    with open(f"{logs}/{name}.json") as f:
        return json.loads(f.read())

def histogram(name):
    """{stage: [(le, cumulative count)]} of the gateway's added-latency histogram."""
    h = {}
    pat = re.compile(r'^spillway_gateway_added_latency_seconds_bucket\{stage="([^"]+)",le="([^"]+)"\} (\d+)')
    with open(f"{logs}/{name}.prom") as f:
        for line in f:
            m = pat.match(line)
            if m:
                le = math.inf if m[2] == "+Inf" else float(m[2])
                h.setdefault(m[1], []).append((le, int(m[3])))
    return h

def quantile(buckets, q):
    """histogram_quantile: linear within the bucket; None when empty."""
    total = buckets[-1][1] if buckets else 0
    if total == 0:
        return None
    rank, prev_le, prev_c = q * total, 0.0, 0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le * 1e3
            return (prev_le + (le - prev_le) * (rank - prev_c) / max(c - prev_c, 1)) * 1e3
        prev_le, prev_c = le, c
    return None

def gateway_stages(before, after):
    """Per-stage p50/p99 (ms) of what the phase added to the histogram."""
    b, a = histogram(before), histogram(after)
    out = {}
    for stage, buckets in a.items():
        base = dict(b.get(stage, []))
        delta = [(le, c - base.get(le, 0)) for le, c in buckets]
        n = delta[-1][1] if delta else 0
        out[stage] = {"count": n, "p50_ms": quantile(delta, 0.50), "p99_ms": quantile(delta, 0.99)}
    return out

def pooled(side):
    """The JSON lines of every round of one side, plus percentiles over all their samples."""
    runs = [load(f"{side}{i}") for i in range(1, rounds + 1)]
    lat, ttft = [], []
    for i in range(1, rounds + 1):
        with open(f"{logs}/{side}{i}.samples") as fh:
            s = json.load(fh)
        lat += s["latency_ms"]
        ttft += s["ttft_ms"]
    lat.sort()
    ttft.sort()
    def pct(v, p):  # nearest rank, as spillway-loadgen computes it
        return v[max(1, min(len(v), math.ceil(p / 100 * len(v)))) - 1] if v else None
    return {"concurrency": runs[0]["concurrency"], "max_tokens": runs[0]["max_tokens"],
            "completed": sum(x["completed"] for x in runs),
            "errors": sum(x["errors"] for x in runs),
            "rps": sum(x["rps"] for x in runs) / len(runs),
            "p50_ms": pct(lat, 50), "p90_ms": pct(lat, 90), "p99_ms": pct(lat, 99),
            "ttft_p50_ms": pct(ttft, 50), "ttft_p90_ms": pct(ttft, 90), "ttft_p99_ms": pct(ttft, 99),
            "rounds": runs}

d, g, r = pooled("direct"), pooled("gateway"), load("rps")
def diff(k):
    return None if d.get(k) is None or g.get(k) is None else g[k] - d[k]
# The same difference per round: how much of it is noise shows in how they spread.
round_added_p99 = [round(gx["p99_ms"] - dx["p99_ms"], 3) for dx, gx in zip(d["rounds"], g["rounds"])]
round_added_ttft_p99 = [round(gx["ttft_p99_ms"] - dx["ttft_p99_ms"], 3)
                        for dx, gx in zip(d["rounds"], g["rounds"])]
added = {"p50_ms": diff("p50_ms"), "p99_ms": diff("p99_ms"),
         "ttft_p50_ms": diff("ttft_p50_ms"), "ttft_p99_ms": diff("ttft_p99_ms")}
worst_p99 = max(v for v in (added["p99_ms"], added["ttft_p99_ms"]) if v is not None)
stream_stages = gateway_stages("before-stream", "after-stream")
rps_stages = gateway_stages("before-rps", "after-rps")
p99_ok, rps_ok = worst_p99 < P99_TARGET_MS, r["rps"] >= RPS_TARGET

def f(v, w=9):
    return f"{v:{w}.3f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"

print()
print(f"Spillway gateway benchmark (loopback, CPUs: {cpus}; loadgen, gateway and workers share them)")
print(f"  streams: {d['concurrency']} concurrent, {d['max_tokens']} tokens each, "
      f"{d['completed']} direct / {g['completed']} via gateway, 0 errors, "
      f"{rounds} alternating round(s), percentiles over all of them")
print(f"  {'(ms)':<24}{'p50':>9}{'p90':>9}{'p99':>9}{'ttft p50':>10}{'ttft p99':>10}")
for name, x in (("direct (worker)", d), ("through gateway", g)):
    print(f"  {name:<24}{f(x['p50_ms'])}{f(x['p90_ms'])}{f(x['p99_ms'])}"
          f"{f(x['ttft_p50_ms'], 10)}{f(x['ttft_p99_ms'], 10)}")
print(f"  {'added by the gateway':<24}{f(added['p50_ms'])}{'':>9}{f(added['p99_ms'])}"
      f"{f(added['ttft_p50_ms'], 10)}{f(added['ttft_p99_ms'], 10)}")
for stage, s in sorted(stream_stages.items()):
    print(f"  {'gateway /metrics ' + stage:<24}{f(s['p50_ms'])}{'':>9}{f(s['p99_ms'])}"
          f"   ({s['count']} observations)")
if rounds > 1:
    print(f"  {'added p99 by round':<24}" + " ".join(f"{v:.3f}" for v in round_added_p99)
          + "   (ttft: " + " ".join(f"{v:.3f}" for v in round_added_ttft_p99) + ")")
if any(v is not None and v < 0 for v in added.values()):
    print("  (a negative difference is run-to-run noise between two separate runs: the gateway")
    print("   cannot make a request faster; /metrics shows its own time per request and chunk)")
print(f"  max rps: {r['rps']:.0f} requests/s ({r['concurrency']} connections, max_tokens 1, "
      f"non-streaming), latency p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms, "
      f"{r['completed']} requests, {r['errors']} errors")
print(f"  targets: p99 added < {P99_TARGET_MS:g} ms: {'MET' if p99_ok else 'MISSED'} "
      f"({worst_p99:.3f} ms); >= {RPS_TARGET:,.0f} req/s: {'MET' if rps_ok else 'MISSED'} "
      f"({r['rps']:.0f})")

result = {
    "bench": "gateway", "cpus": cpus,
    "streams": d["concurrency"], "stream_tokens": d["max_tokens"],
    "direct": {k: d[k] for k in ("completed", "rps", "p50_ms", "p99_ms", "ttft_p50_ms", "ttft_p99_ms")},
    "gateway": {k: g[k] for k in ("completed", "rps", "p50_ms", "p99_ms", "ttft_p50_ms", "ttft_p99_ms")},
    "added_p50_ms": added["p50_ms"], "added_p99_ms": added["p99_ms"],
    "added_ttft_p50_ms": added["ttft_p50_ms"], "added_ttft_p99_ms": added["ttft_p99_ms"],
    "rounds": rounds, "added_p99_ms_by_round": round_added_p99,
    "added_ttft_p99_ms_by_round": round_added_ttft_p99,
    "gateway_metrics_stream": stream_stages, "gateway_metrics_rps": rps_stages,
    "rps": r["rps"], "rps_concurrency": r["concurrency"], "rps_p50_ms": r["p50_ms"],
    "rps_p99_ms": r["p99_ms"], "rps_completed": r["completed"],
    "errors": d["errors"] + g["errors"] + r["errors"],
    "target_p99_added_ms": P99_TARGET_MS, "p99_added_ms": worst_p99, "p99_target_met": p99_ok,
    "target_rps": RPS_TARGET, "rps_target_met": rps_ok,
}
print(json.dumps(result, separators=(",", ":")))
sys.exit(1 if strict and not (p99_ok and rps_ok) else 0)
PY
