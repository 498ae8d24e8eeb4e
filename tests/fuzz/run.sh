#!/usr/bin/env bash
# Runs libFuzzer programs (make fuzz builds them) and prints a table of what
# each did; exits 1 if any found a crash, a leak, undefined behaviour or a
# broken invariant (the harnesses abort on one).
#   tests/fuzz/run.sh BIN_DIR SECONDS JOBS NAME...
# Each NAME starts from tests/fuzz/corpus/NAME/, copied into a scratch
# folder that libFuzzer grows, so runs never write into the repository.
# What a failing target left (crash-*, leak-*, timeout-*) is kept under
# BIN_DIR/artifacts/NAME/ for tests/fuzz/corpus/NAME/.
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=$1 secs=$2 jobs=$3
shift 3
work=$(mktemp -d "${TMPDIR:-/tmp}/spillway-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
# Sanitizer reports end the run with an error (libFuzzer reports it as a crash).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:protect_shadow_gap=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=1

run_one() {
  local name=$1 w=$work/$1
  mkdir -p "$w/corpus" "$w/out"
  [ -d "tests/fuzz/corpus/$name" ] && cp "tests/fuzz/corpus/$name"/* "$w/corpus/" 2>/dev/null
  # -timeout: one input taking 10 s (sanitized) is a hang worth a report;
  # -rss_limit_mb: a harness that grows past 2 GB is a leak or a blow-up.
  "$bin/$name" -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$w/out/" "$w/corpus" > "$w/log" 2>&1
  echo $? > "$w/rc"
}
export -f run_one
export bin secs work
printf '%s\n' "$@" | xargs -P "$jobs" -I{} bash -c 'run_one {}'

stat() { sed -n "s/^stat::$2: *//p" "$work/$1/log" | tail -1; }
fail=0
printf '%-18s %12s %10s %8s %8s  %s\n' target executions exec/s corpus rss_mb result
for name in "$@"; do
  rc=$(cat "$work/$name/rc" 2>/dev/null || echo 99)
  result=ok
  if [ "$rc" != 0 ]; then
    result="FAILED (rc $rc)"
    fail=1
    mkdir -p "$bin/artifacts/$name"
    cp "$work/$name/out/"* "$bin/artifacts/$name/" 2>/dev/null
    cp "$work/$name/log" "$bin/artifacts/$name/log"
  fi
  printf '%-18s %12s %10s %8s %8s  %s\n' "$name" "$(stat "$name" number_of_executed_units)" \
    "$(stat "$name" average_exec_per_sec)" "$(ls "$work/$name/corpus" | wc -l)" "$(stat "$name" peak_rss_mb)" "$result"
done
if [ $fail = 1 ]; then
  for name in "$@"; do
    [ "$(cat "$work/$name/rc" 2>/dev/null)" = 0 ] && continue
    echo "== $name: last lines of its log (all of it and its inputs: $bin/artifacts/$name/)"
    tail -40 "$work/$name/log"
  done
fi
exit $fail
