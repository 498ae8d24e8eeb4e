#!/bin/sh
# Kubernetes preStop hook of a worker (ops/k8s/worker-*.yaml): drain this
# worker at the gateway, then wait until it has nothing in flight, so that
# the SIGTERM that follows (which fails what is still running with 503,
# proto/worker_link.c) loses no request.
#   spillway-prestop-drain ADMIN_TOKEN_FILE MAX_SECONDS
# Needs $POD_NAME (= --worker-id) and $SPILLWAY_GATEWAY_HTTP (http://host:port).
set -u
token_file=$1; max=${2:-280}
id=${POD_NAME:?POD_NAME must be the worker id}
gw=${SPILLWAY_GATEWAY_HTTP:?}
# The operator API's drain (docs/operations.md): takes nothing new.
curl -fsS -X POST -H "Authorization: Bearer $(cat "$token_file")" \
     -H "Content-Type: application/json" -d '{"reason":"pod terminating (preStop)"}' \
     "$gw/admin/workers/$id/drain" >/dev/null ||
  echo "prestop: drain request failed; waiting for in-flight work anyway" >&2
# Empty when the gateway's per-worker in-flight gauge reads 0 (or the
# gateway no longer lists the worker).
i=0
while [ "$i" -lt "$max" ]; do
  n=$(curl -fsS "$gw/metrics" 2>/dev/null |
      grep "^spillway_worker_inflight{.*worker=\"$id\"" | awk '{print $2}' | head -n1)
  case "$n" in ""|0|0.0) exit 0;; esac
  sleep 1; i=$((i + 1))
done
echo "prestop: still $n in flight after ${max}s; stopping anyway" >&2
exit 0
