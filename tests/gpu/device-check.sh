#!/usr/bin/env bash
# One-shot check of the GPU worker on a machine with an H200 (or any Hopper /
# sm_89+) GPU. Self-contained: builds, checks correctness on the GPU, times
# batched decode on an 8b-shape model, prints a table and one JSON line.
# Every step is bounded with `timeout`; the whole run stays under 8 minutes.
#
#   tests/gpu/device-check.sh            (from anywhere; $OUT set -> log + JSON there)
#
# Data: golden models and stories260K are looked up in $SPILLWAY_SHARED, then
# ./.device-carry/shared (an ignored folder you can carry to the device), then
# ../shared. Checks whose data is missing say SKIP; they never pass silently.
# Env: DC_BATCHES (default 1,8,64,256), DC_STEPS (32), DC_CTX (512),
#      DC_SYNTH_TYPE (q8_0: fastest to write and to load), DC_SYNTH8B=0 (use in-process
#      random 8b-shape weights instead of a spillway-synth file), DC_SKIP_BUILD=1.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
T0=$(date +%s)
LOG=${OUT:+$OUT/device-check.log}
LOG=${LOG:-/tmp/device-check.log}
mkdir -p "$(dirname "$LOG")"
exec > >(tee "$LOG") 2>&1

B=${SPILLWAY_BUILD:-build}
BIN=$ROOT/$B/bin
W=$BIN/spillway-worker-gpu
BATCHES=${DC_BATCHES:-1,8,64,256}
STEPS=${DC_STEPS:-32}
CTX=${DC_CTX:-512}
SYNTH_TYPE=${DC_SYNTH_TYPE:-q8_0}
TMP=$(mktemp -d /tmp/spillway-dc.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
declare -A RES          # check name -> PASS / FAIL / SKIP (+ detail)
FAILS=0

say() { printf '\n=== [%3ds] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
record() {  # name status detail
    RES[$1]="$2 $3"
    [ "$2" = FAIL ] && FAILS=$((FAILS + 1))
    printf '%-28s %-5s %s\n' "$1" "$2" "$3"
}

SHARED=""
for d in "${SPILLWAY_SHARED:-}" "$ROOT/.device-carry/shared" "$ROOT/../shared" "$ROOT/shared"; do
    [ -n "$d" ] && [ -d "$d" ] && { SHARED=$(cd "$d" && pwd); break; }
done
echo "spillway device check: $(date -u +%Y-%m-%dT%H:%M:%SZ), repo $ROOT, build $B, shared ${SHARED:-<none>}"

say "GPU"
timeout 30 nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv || true
GPU_NAME=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
NPROC=$(nproc)

say "build (make -j$NPROC all)"
if [ "${DC_SKIP_BUILD:-0}" != 1 ]; then
    # The CUDA objects are C++ (nvcc host code): the link needs libstdc++.
    SYS=$(sed -n 's/^SYSLIBS *:= *//p' Makefile)
    EXTRA=()
    grep -q -- '-lstdc++' Makefile || EXTRA=("SYSLIBS=$SYS -lstdc++")
    if timeout 330 make -j"$NPROC" B="$B" all ${EXTRA[@]+"${EXTRA[@]}"} > "$TMP/build.log" 2>&1; then
        record build PASS "$(( $(date +%s) - T0 ))s"
    else
        tail -40 "$TMP/build.log"
        # other programs may fail mid-development: build at least the worker
        if timeout 200 make -j"$NPROC" B="$B" "$B/bin/spillway-worker-gpu" "$B/bin/spillway-run" "$B/bin/spillway-synth" \
                ${EXTRA[@]+"${EXTRA[@]}"} >> "$TMP/build.log" 2>&1; then
            record build FAIL "make all failed; the worker itself built"
        else
            tail -20 "$TMP/build.log"
            record build FAIL "spillway-worker-gpu did not build"
        fi
    fi
fi
[ -x "$W" ] || { echo "no $W: stopping"; echo "{\"device_check\":\"failed\",\"reason\":\"no worker binary\"}"; exit 1; }

say "kernel self-test: FP8 GEMV vs cuBLASLt vs host reference"
if timeout 120 "$W" --selftest; then record selftest PASS ""; else record selftest FAIL "see above"; fi

# compare NAME MODEL IDS REF  -> runs --backend cuda --ref-logits, checks thresholds
golden_check() {
    local name=$1 model=$2 ids=$3 ref=$4 step=$5
    local out rc
    out=$(timeout 120 "$W" --backend cuda -q -m "$model" --tokens "$ids" --ref-logits "$ref" \
          --max-tokens-per-step "$step" --kv-blocks 64 2>"$TMP/err")
    rc=$?
    [ $rc -eq 0 ] || { cat "$TMP/err"; record "$name" FAIL "exit $rc"; return; }
    local cos top
    cos=$(echo "$out" | awk '/^compare:/ {print $5}')
    top=$(echo "$out" | awk '/^compare:/ {print $9}')
    if awk -v c="$cos" -v t="$top" 'BEGIN { exit !(c >= 0.985 && t >= 0.65) }'; then
        record "$name" PASS "min_cos $cos top1 $top"
    else
        record "$name" FAIL "min_cos $cos top1 $top (need 0.985 / 0.65)"
    fi
}

say "golden models on the GPU (vs llama.cpp logits: min cosine >= 0.985, top-1 >= 65%)"
n_golden=0
for g in "$SHARED"/golden/*.gguf; do
    [ -f "$g" ] || continue
    base=${g%.gguf}; name=$(basename "$base")
    [ -f "$base.tokens" ] && [ -f "$base.logits.f32" ] || { record "golden:$name" SKIP "tokens/logits missing"; continue; }
    ids=$(tr -s ' \n' ',,' < "$base.tokens" | sed 's/^,//; s/,$//')
    golden_check "golden:$name:lt" "$g" "$ids" "$base.logits.f32" 512   # whole sequence: cuBLASLt path
    golden_check "golden:$name:gemv" "$g" "$ids" "$base.logits.f32" 8   # steps of 8: GEMV path
    n_golden=$((n_golden + 1))
done
[ $n_golden -gt 0 ] || record golden SKIP "no golden models under ${SHARED:-<none>}/golden"

say "GPU vs the CPU emulation of the same numerics (random FP8 weights, 8b layer shape, 2 layers)"
# hd 128, GQA group 4, vocabulary 128256: the kernels the 8b benchmark runs.
ids=$(seq -s, 3 3001 120000 | cut -d, -f1-40)
for step in 512 8; do
    if timeout 120 "$W" --backend emulate -q --bench-shape 8b --bench-layers 2 --tokens "$ids" \
            --logits-out "$TMP/emu.f32" --max-tokens-per-step $step > /dev/null 2>"$TMP/err"; then
        out=$(timeout 60 "$W" --backend cuda -q --bench-shape 8b --bench-layers 2 --tokens "$ids" \
              --ref-logits "$TMP/emu.f32" --max-tokens-per-step $step 2>>"$TMP/err")
        cos=$(echo "$out" | awk '/^compare:/ {print $5}'); top=$(echo "$out" | awk '/^compare:/ {print $9}')
        if awk -v c="${cos:-0}" -v t="${top:-0}" 'BEGIN { exit !(c >= 0.999 && t >= 0.8) }'; then
            record "cuda=emulate:step$step" PASS "min_cos $cos top1 $top"
        else
            cat "$TMP/err"; record "cuda=emulate:step$step" FAIL "min_cos ${cos:-?} top1 ${top:-?} (need 0.999 / 0.8)"
        fi
    else
        cat "$TMP/err"; record "cuda=emulate:step$step" FAIL "emulation run failed"
    fi
done
rm -f "$TMP/emu.f32"

say "other architectures: GPU vs the CPU emulation (NEOX RoPE, q/k/v biases, q/k norms, fused tensors, GELU, scaled embeddings)"
n_arch=0
for m in "${SHARED:-/nonexistent}"/arch/*.gguf; do
    [ -f "$m" ] || continue
    n_arch=$((n_arch + 1)); name=$(basename "$m" .gguf)
    ids=1,260,261,262,263,264,265,300,301,310,5,6,7,8,9,270,271,280,290,266
    if timeout 60 "$W" --backend emulate -q -m "$m" --tokens "$ids" --logits-out "$TMP/emu.f32" > /dev/null 2>"$TMP/err"; then
        out=$(timeout 60 "$W" --backend cuda -q -m "$m" --tokens "$ids" --ref-logits "$TMP/emu.f32" --kv-blocks 64 2>>"$TMP/err")
        cos=$(echo "$out" | awk '/^compare:/ {print $5}'); top=$(echo "$out" | awk '/^compare:/ {print $9}')
        if awk -v c="${cos:-0}" 'BEGIN { exit !(c >= 0.999) }'; then
            record "arch:$name" PASS "min_cos $cos top1 $top"
        else
            cat "$TMP/err"; record "arch:$name" FAIL "min_cos ${cos:-?} top1 ${top:-?} (need 0.999)"
        fi
    elif grep -q "which the GPU worker does not implement" "$TMP/err"; then
        # architectures the GPU worker refuses by name (test_arch checks the refusals)
        record "arch:$name" SKIP "refused: $(grep -o 'uses .*, which' "$TMP/err" | head -1 | sed 's/^uses //; s/, which$//')"
    else
        cat "$TMP/err"; record "arch:$name" FAIL "emulation run failed"
    fi
done
[ $n_arch -gt 0 ] || record arch SKIP "no files under ${SHARED:-<none>}/arch (tests/gpu/prepare-carry.sh makes them)"
rm -f "$TMP/emu.f32"

say "prefix cache: the same prompt twice in one engine (shared KV blocks, same text)"
# Steps of at most 16 tokens keep every step on the GEMV path, whose numerics
# do not depend on the batch, so the cached run must give the same text.
pc_model=$(ls "$SHARED"/golden/*.gguf 2>/dev/null | head -1)
if [ -n "$pc_model" ]; then
    pc_prompt="Lily and Tom went to the park to play with a red ball. Lily and Tom went to the park to play with a red ball."
    if timeout 120 "$W" --backend cuda -q -m "$pc_model" -p "$pc_prompt" -n 24 --temp 0 --max-tokens-per-step 16 \
            --repeat 3 > /dev/null 2>"$TMP/err" && grep -q "repeat 3: [1-9][0-9]* of .* text the same" "$TMP/err"; then
        record prefix-cache PASS "$(grep 'repeat 3' "$TMP/err" | sed 's/^[^:]*: //')"
    else
        cat "$TMP/err"; record prefix-cache FAIL "see above"
    fi
else
    record prefix-cache SKIP "no golden model under ${SHARED:-<none>}/golden"
fi

say "stories260K: first 16 greedy tokens, GPU vs the CPU worker"
st=${SHARED:+$SHARED/models/stories260K.gguf}
if [ -n "$st" ] && [ -f "$st" ]; then
    cpu=$(timeout 60 "$BIN/spillway-run" -m "$st" -p "Once upon a time" -n 16 --temp 0 -t 4 2>/dev/null)
    gpu=$(timeout 60 "$W" --backend cuda -q -m "$st" -p "Once upon a time" -n 16 --temp 0 2>"$TMP/err")
    echo "cpu: $cpu"; echo "gpu: $gpu"
    if [ -n "$cpu" ] && [ "$(echo "$cpu" | sed 's/[[:space:]]*$//')" = "$(echo "$gpu" | sed 's/[[:space:]]*$//')" ]; then
        record stories-greedy16 PASS ""
    else
        cat "$TMP/err"; record stories-greedy16 FAIL "texts differ"
    fi
    # batched generation through the scheduler on the GPU (graphs, device sampling)
    if timeout 60 "$W" --backend cuda -m "$st" --bench-decode 1,4,16 --bench-steps 8 --bench-ctx 64 > "$TMP/sb.txt" 2>&1; then
        record stories-batched PASS "$(grep -c '^[0-9]' "$TMP/sb.txt") batch sizes ran"
    else
        cat "$TMP/sb.txt"; record stories-batched FAIL "bench on stories260K failed"
    fi
else
    record stories-greedy16 SKIP "stories260K.gguf missing"
fi

say "8b-shape model ($SYNTH_TYPE) and decode benchmark at batch $BATCHES"
MODEL_ARGS=()
left=$(( 480 - ($(date +%s) - T0) ))
if [ "${DC_SYNTH8B:-1}" != 0 ] && [ $left -gt 300 ] && timeout $(( left - 200 )) "$BIN/spillway-synth" --shape 8b --type "$SYNTH_TYPE" "$TMP/8b.gguf" \
        > "$TMP/synth8b.log" 2>&1; then
    MODEL_ARGS=(-m "$TMP/8b.gguf"); SRC="spillway-synth 8b $SYNTH_TYPE"
else
    tail -3 "$TMP/synth8b.log" 2>/dev/null
    echo "spillway-synth 8b not used (time left ${left}s): falling back to in-process random FP8 weights of the 8b shape"
    MODEL_ARGS=(--bench-shape 8b); SRC="in-process random 8b shape (32 layers)"
fi
left=$(( 470 - ($(date +%s) - T0) ))
BENCH_JSON=""
if timeout $(( left > 60 ? left : 60 )) "$W" --backend cuda "${MODEL_ARGS[@]}" --bench-decode "$BATCHES" \
        --bench-steps "$STEPS" --bench-ctx "$CTX" > "$TMP/bench.txt" 2>"$TMP/bench.err"; then
    cat "$TMP/bench.err" | grep -v '^$' | tail -5
    BENCH_JSON=$(grep '^{' "$TMP/bench.txt" | tail -1)
    record bench PASS "$SRC"
else
    cat "$TMP/bench.err" | tail -20; record bench FAIL "$SRC"
fi
rm -f "$TMP/8b.gguf"

say "results"
echo "GPU: ${GPU_NAME:-unknown}; model: $SRC; context $CTX; $STEPS timed steps per batch size"
grep -v '^{' "$TMP/bench.txt" 2>/dev/null
# acceptance: batch 1 >= 75% of copy bandwidth; batch 64 >= 25x batch 1 tok/s
b1=$(awk '$1 == 1 {print $3, $5}' "$TMP/bench.txt" 2>/dev/null)
b64=$(awk '$1 == 64 {print $3}' "$TMP/bench.txt" 2>/dev/null)
if [ -n "$b1" ] && [ -n "$b64" ]; then
    set -- $b1
    ratio=$(awk -v a="$b64" -v b="$1" 'BEGIN { printf "%.1f", a / b }')
    awk -v p="$2" 'BEGIN { exit !(p >= 75) }' && record "batch1>=75%copy" PASS "$2%" || record "batch1>=75%copy" FAIL "$2%"
    awk -v r="$ratio" 'BEGIN { exit !(r >= 25) }' && record "batch64>=25x" PASS "${ratio}x" || record "batch64>=25x" FAIL "${ratio}x"
fi
echo
printf '%-28s %s\n' CHECK RESULT
for k in $(printf '%s\n' "${!RES[@]}" | sort); do printf '%-28s %s\n' "$k" "${RES[$k]}"; done
checks=$(for k in $(printf '%s\n' "${!RES[@]}" | sort); do
    set -- ${RES[$k]}; printf '"%s":"%s",' "$k" "$1"; done)
echo "{\"device_check\":\"$([ $FAILS -eq 0 ] && echo pass || echo fail)\",\"gpu\":\"${GPU_NAME:-unknown}\",\"seconds\":$(( $(date +%s) - T0 )),\"checks\":{${checks%,}},\"bench\":${BENCH_JSON:-null}}" | tee "${OUT:-$TMP}/device-check.json"
exit $([ $FAILS -eq 0 ] && echo 0 || echo 1)
