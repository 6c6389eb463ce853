#!/usr/bin/env bash
# One local "pod": the engine (`kvloop serve`) and its feedback sidecar (`kvloop sidecar`) sharing a
# control block in /dev/shm, as the two containers share an emptyDir in a cluster. Ctrl-C (or a
# TERM) stops both; if either exits on its own, the other is stopped too. On TERM the engine drains for up
# to SHUTDOWN_GRACE seconds (in-flight requests, then the KV flush to the disk tier); this script waits
# that long plus a margin before it KILLs, as the kubelet waits terminationGracePeriodSeconds.
#   env: KVLOOP HOST PORT SIDECAR_PORT CONTROL SIDECAR_CONFIG SIDECAR_ARGS SHUTDOWN_GRACE; extra arguments go
#   to serve.
set -uo pipefail
KVLOOP=${KVLOOP:-.venv/bin/kvloop}
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
SIDECAR_PORT=${SIDECAR_PORT:-9090}
CONTROL=${CONTROL:-/dev/shm/kvloop-control-${PORT}.bin}
SHUTDOWN_GRACE=${SHUTDOWN_GRACE:-20}

"$KVLOOP" serve --host "$HOST" --port "$PORT" --control-file "$CONTROL" --shutdown-grace "$SHUTDOWN_GRACE" "$@" &
engine=$!
# shellcheck disable=SC2086  # SIDECAR_ARGS is a list of words on purpose
"$KVLOOP" sidecar --control "$CONTROL" --host "$HOST" --port "$SIDECAR_PORT" \
    ${SIDECAR_CONFIG:+--config "$SIDECAR_CONFIG"} ${SIDECAR_ARGS:-} &
sidecar=$!
echo "serve_pod: engine pid $engine on $HOST:$PORT, sidecar pid $sidecar on $HOST:$SIDECAR_PORT, control $CONTROL"

stop() {
    trap - INT TERM
    kill -TERM "$engine" "$sidecar" 2>/dev/null
    # the engine's grace period (rounded up) plus 5 s for its own exit, then KILL; polls every 0.2 s
    local whole=${SHUTDOWN_GRACE%.*}
    local polls=$(( (${whole:-0} + 6) * 5 ))
    for _ in $(seq "$polls"); do
        kill -0 "$engine" 2>/dev/null || kill -0 "$sidecar" 2>/dev/null || break
        sleep 0.2
    done
    kill -KILL "$engine" "$sidecar" 2>/dev/null
    wait "$engine" "$sidecar" 2>/dev/null
}
trap 'stop; exit 0' INT TERM
wait -n "$engine" "$sidecar"
rc=$?
echo "serve_pod: a process exited ($rc); stopping the other"
stop
exit "$rc"
