#!/usr/bin/env bash
# A local fleet: N pods (each `kvloop serve` + its feedback sidecar, as `make serve` runs one, through
# scripts/serve_pod.sh) on HOST:BASE_PORT..BASE_PORT+N-1, vllm-router in front of them on ROUTER_PORT, and
# with --store a redis-server that every pod shares as its remote KV tier. Ctrl-C or a TERM stops the router
# first (no new work), then drains the pods (serve_pod.sh's grace), then the store; if any of them exits on
# its own, the rest are stopped too.
#
#   scripts/serve_fleet.sh [--pods N] [--base-port P] [--router-port P] [--policy POLICY] [--store]
#                          [--keep-going] [-- extra kvloop serve arguments]
#   --keep-going: a pod or the store exiting does not stop the fleet (only the router's exit does): a
#   benchmark kills a pod or the store on purpose and watches the rest serve on.
#   POLICY: cache_aware (default: the router's radix tree of the prompts it routed), round_robin,
#   power_of_two, random, consistent_hash, or kv_aware (the router subscribes to each pod's KV events:
#   needs `kvloop serve --kv-events-endpoint`).
#   env: KVLOOP ROUTER HOST SIDECAR_BASE_PORT EVENTS_BASE_PORT STORE_PORT ROUTER_METRICS_PORT BLOCK_SIZE
#        KV_EVENT_MODEL (kv_aware: the model name clients send; default "default") SHUTDOWN_GRACE READY_TIMEOUT
#        ROUTER_ARGS (extra vllm-router arguments, e.g. "--health-check-interval-secs 1")
set -uo pipefail
cd "$(dirname "$0")/.."
KVLOOP=${KVLOOP:-.venv/bin/kvloop}
ROUTER=${ROUTER:-$( [ -x .venv/bin/vllm-router ] && echo .venv/bin/vllm-router || command -v vllm-router )}
HOST=${HOST:-127.0.0.1}
PODS=2 BASE_PORT=8000 ROUTER_PORT=8080 POLICY=cache_aware STORE=0 KEEP_GOING=0
while [ $# -gt 0 ]; do
    case "$1" in
        --pods) PODS=$2; shift 2 ;;
        --base-port) BASE_PORT=$2; shift 2 ;;
        --router-port) ROUTER_PORT=$2; shift 2 ;;
        --policy) POLICY=$2; shift 2 ;;
        --store) STORE=1; shift ;;
        --keep-going) KEEP_GOING=1; shift ;;
        --) shift; break ;;
        *) echo "serve_fleet: unknown option $1 (extra serve arguments go after --)" >&2; exit 2 ;;
    esac
done
SIDECAR_BASE_PORT=${SIDECAR_BASE_PORT:-$((BASE_PORT + 1000))}
EVENTS_BASE_PORT=${EVENTS_BASE_PORT:-$((BASE_PORT + 2000))}
STORE_PORT=${STORE_PORT:-$((BASE_PORT + 3000))}
ROUTER_METRICS_PORT=${ROUTER_METRICS_PORT:-$((ROUTER_PORT + 1))}
BLOCK_SIZE=${BLOCK_SIZE:-16}  # the pods' KV block size, which the router's kv_aware hashing must share
READY_TIMEOUT=${READY_TIMEOUT:-600}
command -v "${ROUTER:-vllm-router}" >/dev/null ||
    { echo "serve_fleet: vllm-router not found (pip install vllm-router, or set ROUTER)" >&2; exit 2; }

# Pass an engine flag only if this kvloop has it (the remote tier and KV events came in separately).
SERVE_HELP=$("$KVLOOP" serve --help 2>&1)
has_flag() { grep -q -- "$1" <<<"$SERVE_HELP"; }

pids=()
router=""
store=""
stop() {
    trap - INT TERM
    [ -n "$router" ] && kill -TERM "$router" 2>/dev/null && wait "$router" 2>/dev/null
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    wait "${pids[@]}" 2>/dev/null  # each serve_pod.sh drains its engine, then KILLs what is left
    [ -n "$store" ] && kill -TERM "$store" 2>/dev/null && wait "$store" 2>/dev/null
    echo "serve_fleet: stopped"
}
trap 'stop; exit 0' INT TERM

pod_args=(--block-size "$BLOCK_SIZE")
if [ "$STORE" = 1 ]; then
    redis-server --bind "$HOST" --port "$STORE_PORT" --save "" --appendonly no --loglevel warning &
    store=$!
    echo "serve_fleet: store pid $store on $HOST:$STORE_PORT"
    if has_flag --kv-remote-url; then
        pod_args+=(--kv-remote-url "redis://$HOST:$STORE_PORT/0")
    else
        echo "serve_fleet: this kvloop has no --kv-remote-url; the store runs unused" >&2
    fi
fi
if [ "$POLICY" = kv_aware ] && ! has_flag --kv-events-endpoint; then
    echo "serve_fleet: kv_aware needs kvloop serve --kv-events-endpoint, which this kvloop lacks" >&2
    stop; exit 2
fi

router_args=(--host "$HOST" --port "$ROUTER_PORT" --policy "$POLICY" --prometheus-port "$ROUTER_METRICS_PORT"
             --health-check-endpoint /ready --worker-urls)
event_args=()
for i in $(seq 0 $((PODS - 1))); do
    port=$((BASE_PORT + i))
    args=("${pod_args[@]}")
    if [ "$POLICY" = kv_aware ]; then
        # the pod's PUB socket binds only to a wildcard address (vLLM's rule) and the router's SUB connects
        evport=$((EVENTS_BASE_PORT + i))
        args+=(--kv-events-endpoint "tcp://*:$evport")
        event_args+=(--kv-event-source "http://$HOST:$port=tcp://$HOST:$evport")
    fi
    KVLOOP=$KVLOOP HOST=$HOST PORT=$port SIDECAR_PORT=$((SIDECAR_BASE_PORT + i)) \
        bash scripts/serve_pod.sh "${args[@]}" "$@" &
    pids+=($!)
    router_args+=("http://$HOST:$port")
done
# the router keys its KV-event index by a model identity, which it requires with static sources
[ "$POLICY" = kv_aware ] && router_args+=("${event_args[@]}" --kv-event-block-size "$BLOCK_SIZE"
                                          --kv-event-model "${KV_EVENT_MODEL:-default}")

# The router starts once every pod answers /ready (model loaded): its own start-up check reads /health,
# which answers while a pod still loads; afterwards it checks /ready, so a draining pod leaves the rotation.
deadline=$((SECONDS + READY_TIMEOUT))
for i in $(seq 0 $((PODS - 1))); do
    until curl -sf "http://$HOST:$((BASE_PORT + i))/ready" >/dev/null; do
        if [ $SECONDS -ge $deadline ] || ! kill -0 "${pids[$i]}" 2>/dev/null; then
            echo "serve_fleet: pod $i (port $((BASE_PORT + i))) did not become ready" >&2
            stop; exit 1
        fi
        sleep 0.5
    done
done
# shellcheck disable=SC2086  # ROUTER_ARGS is a list of words on purpose
"$ROUTER" "${router_args[@]}" ${ROUTER_ARGS:-} &
router=$!
echo "serve_fleet: $PODS pods on $HOST:$BASE_PORT-$((BASE_PORT + PODS - 1)), router ($POLICY) at" \
     "http://$HOST:$ROUTER_PORT/v1${store:+, store redis://$HOST:$STORE_PORT/0}"

if [ "$KEEP_GOING" = 1 ]; then
    wait "$router"
else
    wait -n "$router" "${pids[@]}" ${store:+"$store"}
fi
rc=$?
echo "serve_fleet: a process exited ($rc); stopping the rest"
stop
exit "$rc"
