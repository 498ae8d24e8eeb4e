#!/usr/bin/env bash
# Runs the whole suite with pytest: C unit-test programs are wrapped as pytest
# cases (tests/test_unit_c.py), integration tests start real processes.
set -uo pipefail
cd "$(dirname "$0")/.."
export SPILLWAY_BUILD=${SPILLWAY_BUILD:-build}
export SPILLWAY_SHARED=${SPILLWAY_SHARED:-$(cd .. && pwd)/shared}
case "$SPILLWAY_BUILD" in *-san)
  # Leak checking stays on; abort on the first error so pytest sees a failure.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:protect_shadow_gap=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1};;
*-tsan)
  # OpenMP on one thread: libgomp is not built with TSan (tests/tsan.supp).
  export OMP_NUM_THREADS=1
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp};;
esac
# Arguments add to the whole suite (a -k filter then picks across it); after
# --only, the files named are the suite.
where=tests
if [ "${1:-}" = --only ]; then where=; shift; fi
# Test files run SPILLWAY_TEST_JOBS at a time (default: one per core), each
# file whole in one pytest-xdist worker, so a module's fixtures start once;
# every test takes its ports from one counter (tests/conftest.py), so files
# side by side never collide. -s (the soak prints as it runs) and
# SPILLWAY_TEST_JOBS=1 keep one process.
jobs=${SPILLWAY_TEST_JOBS:-$(nproc)}
par=(-n "$jobs" --dist loadfile)
case " $* " in *" -s "*) par=();; esac
[ "$jobs" -gt 1 ] || par=()
# --durations: the slowest tests are named, to keep CI inside its budget.
.venv/bin/python -m pytest -q -rs --durations=12 "${par[@]}" $where "$@"
rc=$?
# pytest exit 5 = no tests collected: that is a failure for us.
exit $rc
