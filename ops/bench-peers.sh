#!/usr/bin/env bash
# `make bench-peers`: make bench's figures beside llama.cpp's, on the same
# file, threads and host, in one sitting. The CPU targets ask for batch 1 no
# slower than llama.cpp's on the same host, and a figure from another day
# on these shared machines says little.
#   - llama.cpp is the tree that llama-cpp-python $LCPP_VERSION vendors (the
#     PyPI sdist, fetched with pip the first time into $PEER_DIR; none of it
#     is in this repository). It is built with CMake once per LLAMA_ISA:
#     native (the default) or avx2 (AVX2, FMA and F16C, without AVX-512 or
#     AVX-VNNI: what it runs on a Zen 3). SPILLWAY_ISA forces ours as usual.
#   - ROUNDS (default 2) rounds, each spillway-bench (PROMPT, GEN, BATCHES,
#     DEPTH), then llama-bench for prefill, then llama-batched-bench for
#     decode at BATCHES (its S_TG: tokens/s over all sequences). Both caches
#     are f16. DEPTH (default 0) positions of context come first: llama-bench
#     -d DEPTH, and batched-bench's prompt (-npp) is DEPTH long, so its
#     decode starts where ours does (at DEPTH 0 its prompt is 16 tokens:
#     it needs one);
#   - prints a table a round a row and, last, one JSON line.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-2}
LLAMA_ISA=${LLAMA_ISA:-native}
LCPP_VERSION=${LCPP_VERSION:-0.3.36}
PEER_DIR=${PEER_DIR:-build/peers}
PY=${PYTHON:-.venv/bin/python}   # make deps made it, with pip

NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
case "$LLAMA_ISA" in
  # AMX off (-march=native turns it on, and these -mno- flags win over it):
  # its matmul, ggml_backend_amx_mul_mat, crashed on the Intel host with AMX
  # in this tree (docs/perf/cpu.md, "Beside llama.cpp, with the new make bench-peers")
  native) ISA_FLAGS=(-DGGML_NATIVE=ON "-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX") ;;
  avx2) ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
                   -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF) ;;
  *) echo "bench-peers: LLAMA_ISA=$LLAMA_ISA: native or avx2" >&2; exit 2 ;;
esac

# The vendored tree, fetched and unpacked once.
src="$PEER_DIR/llama-cpp-python-$LCPP_VERSION/vendor/llama.cpp"
if [ ! -f "$src/CMakeLists.txt" ]; then
  mkdir -p "$PEER_DIR"
  echo "bench-peers: fetching llama-cpp-python $LCPP_VERSION (sdist) for its llama.cpp tree" >&2
  if ! "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$LCPP_VERSION" -d "$PEER_DIR"; then
    echo "bench-peers: could not fetch llama-cpp-python $LCPP_VERSION from PyPI; put its sdist in $PEER_DIR" >&2
    exit 1
  fi
  rm -rf "$PEER_DIR/llama-cpp-python-$LCPP_VERSION"
  mkdir -p "$PEER_DIR/llama-cpp-python-$LCPP_VERSION"
  tar -xzf "$PEER_DIR/llama_cpp_python-$LCPP_VERSION.tar.gz" --strip-components=1 \
      -C "$PEER_DIR/llama-cpp-python-$LCPP_VERSION"
fi
lbuild="$PEER_DIR/llama.cpp-$LCPP_VERSION-$LLAMA_ISA"
if [ ! -x "$lbuild/bin/llama-batched-bench" ] || [ ! -x "$lbuild/bin/llama-bench" ]; then
  echo "bench-peers: building llama.cpp ($LLAMA_ISA) in $lbuild (a few minutes)" >&2
  cmake -S "$src" -B "$lbuild" -G Ninja -DCMAKE_BUILD_TYPE=Release "${ISA_FLAGS[@]}" -DGGML_OPENMP=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF > "$lbuild.cmake.log" 2>&1 ||
    { echo "bench-peers: cmake failed; see $lbuild.cmake.log" >&2; exit 1; }
  ninja -C "$lbuild" llama-bench llama-batched-bench > "$lbuild.build.log" 2>&1 ||
    { echo "bench-peers: the build failed; see $lbuild.build.log" >&2; exit 1; }
fi

. ops/bench-common.sh

# One llama.cpp tool; its chatter goes to a log, and a failure says where.
peer() {
  local tool=$1 rc=0; shift
  "$lbuild/bin/$tool" "$@" 2> "$lbuild.$tool.log" || rc=$?
  if [ $rc -ne 0 ]; then
    echo "bench-peers: $tool failed (exit $rc); see $lbuild.$tool.log" >&2
    return $rc
  fi
}

maxb=$(tr ',' '\n' <<< "$BATCHES" | sort -n | tail -n 1)
npp=$((DEPTH > 0 ? DEPTH : 16))
ctx=$((maxb * (npp + GEN) + 256))
runs=$(mktemp)
trap 'rm -f "$runs"' EXIT
for r in $(seq 1 "$ROUNDS"); do
  echo "bench-peers: round $r of $ROUNDS" >&2
  ours=$("$BIN/spillway-bench" -m "$MODEL" -t "$THREADS" -p "$PROMPT" -n "$GEN" -b "$BATCHES" -d "$DEPTH" |
         tail -n 1)
  pp=$(peer llama-bench -m "$MODEL" -t "$THREADS" -p "$PROMPT" -n 0 -d "$DEPTH" -r 1 -o json)
  tg=$(peer llama-batched-bench -m "$MODEL" -t "$THREADS" -c "$ctx" -npp "$npp" -ntg "$GEN" -npl "$BATCHES" \
       --output-format jsonl | grep '^{')
  "$PY" - "$ours" "$pp" "$tg" >> "$runs" <<'EOF'
import json, sys
ours, pp, tg = json.loads(sys.argv[1]), json.loads(sys.argv[2]), [json.loads(l) for l in sys.argv[3].splitlines()]
print(json.dumps({"spillway": ours, "llama_pp_tokens_per_s": pp[0]["avg_ts"],
                  "llama_decode": {str(d["pl"]): d["speed_tg"] for d in tg}}))
EOF
done

"$PY" - "$runs" "$LLAMA_ISA" "$LCPP_VERSION" "$THREADS" "$PROMPT" "$GEN" <<'EOF'
import json, sys
rounds = [json.loads(l) for l in open(sys.argv[1])]
llama_isa, version, threads, prompt, gen = sys.argv[2:7]
first = rounds[0]["spillway"]
batches = [d["batch"] for d in first["decode"]]
print(f"host {first['cpu_model']}; spillway isa {first['isa']}, llama.cpp {llama_isa} "
      f"(llama-cpp-python {version}'s tree); {threads} threads, prefill {prompt}, decode {gen} steps, "
      f"depth {first['depth']}")
head = ["round", "beside GB/s", f"prefill {prompt}: ours", "llama.cpp"]
for b in batches: head += [f"b{b}: ours", "llama.cpp"]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for i, r in enumerate(rounds, 1):
    s, dec = r["spillway"], {d["batch"]: d for d in r["spillway"]["decode"]}
    row = [str(i), f"{dec[batches[0]]['mem_read_beside_gb_per_s']:.1f}",
           f"{s['prefill_tokens_per_s']:.1f}", f"{r['llama_pp_tokens_per_s']:.1f}"]
    for b in batches:
        row += [f"{dec[b]['tokens_per_s']:.1f}", f"{r['llama_decode'].get(str(b), float('nan')):.1f}"]
    print("| " + " | ".join(row) + " |")
print(json.dumps({"bench": "peers", "llama_cpp": f"llama-cpp-python {version}", "llama_isa": llama_isa,
                  "rounds": rounds}))
EOF
