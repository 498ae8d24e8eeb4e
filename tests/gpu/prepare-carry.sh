#!/usr/bin/env bash
# Prepares .device-carry/ (git-ignored) for a run of device-check.sh on a lent
# GPU machine. That machine has nvcc but none of our Debian -dev packages and no
# network, so we build here (nvcc compiles for sm_90a/sm_89) and carry the
# binaries, the shared libraries they need beyond glibc/libstdc++/CUDA, and the
# test data that fits the 64 MiB carry limit. Then, with the device tool:
#   run  carry=[".device-carry"]  timeout_s=560  command=
#     export LD_LIBRARY_PATH=$PWD/.device-carry/lib:$(dirname $(readlink -f $(command -v nvcc)))/../lib64;
#     SPILLWAY_BUILD=.device-carry/build DC_SKIP_BUILD=1 SPILLWAY_SHARED=.device-carry/shared tests/gpu/device-check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${SPILLWAY_SHARED:-../shared}
make -j"$(nproc)" build/bin/spillway-worker-gpu build/bin/spillway-run build/bin/spillway-synth build/bin/spillway-quantize
C=.device-carry
rm -rf "$C" && mkdir -p "$C/build/bin" "$C/lib" "$C/shared/golden" "$C/shared/models"
cp build/bin/spillway-worker-gpu build/bin/spillway-run build/bin/spillway-synth "$C/build/bin/"
strip "$C"/build/bin/*
for b in "$C"/build/bin/*; do ldd "$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux|libpthread|libdl|librt|libresolv)[.-]|cuda' |
  xargs -r -I{} cp -L {} "$C/lib/"
# The spm golden model and stories260K fit; the gpt2 golden model (52 MB) does not.
cp "$SHARED"/golden/synth-spm-d256-q4km.* "$C/shared/golden/" 2>/dev/null || echo "no golden data in $SHARED"
cp "$SHARED"/models/stories260K.gguf "$C/shared/models/" 2>/dev/null || echo "no stories260K in $SHARED"
# One small file per architecture (tests/archmodels.py, then q8_0) for the
# CUDA-against-emulation check of their graph differences.
mkdir -p "$C/shared/arch"
.venv/bin/python - "$C/shared/arch" <<'PY'
import subprocess, sys
sys.path.insert(0, "tests")
import archmodels as am
for arch in am.ARCHS:
    hp, w = am.make_weights(arch, seed=11)
    src = f"{sys.argv[1]}/{arch}-f32.gguf"
    am.write_model(src, arch, hp, w, fused_qkv=arch in ("qwen2", "phi3"))
    subprocess.run(["build/bin/spillway-quantize", src, src.replace("-f32", ""), "q8_0"], check=True,
                   capture_output=True)
    subprocess.run(["rm", src], check=True)
PY
du -sh "$C"
