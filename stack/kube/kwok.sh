#!/usr/bin/env bash
# Start kwok, the fake kubelet of the test control plane (called by up.sh; runnable alone on a
# running control plane). Besides the pod and node stages (kwok-stages.yaml), kwok runs its
# kubelet server on 127.0.0.1:$ISTHMUS_KUBE_KWOK_PORT (HTTPS, the apiserver's serving cert), so
# that `pods/log` works: the apiserver reaches it through each fake node's address (127.0.0.1,
# set by up.sh) and daemonEndpoints.kubeletEndpoint.Port. Pod output comes from files: a
# kwok.x-k8s.io/v1alpha1 Logs object named like the pod names the file (in CRI log format,
# "<RFC 3339 time> stdout F <line>") that stands in for its container's output.
# Idempotent: a running kwok started with the same command line is kept; one started with
# another (an older up.sh) is stopped and started again. Nothing else is touched.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# The physical path: the kwok process must not depend on the checkout that started it
# (its configuration is copied into the state directory).
STATE="$(mkdir -p "${ISTHMUS_KUBE_STATE:-$REPO/.stack/kube}" && cd -P "${ISTHMUS_KUBE_STATE:-$REPO/.stack/kube}" && pwd)"
CACHE="${ISTHMUS_CACHE:-/var/cache/isthmus}/kube"
source "$HERE/versions.sh"
API_PORT="${ISTHMUS_KUBE_API_PORT:-16443}"
KWOK_PORT="${ISTHMUS_KUBE_KWOK_PORT:-16447}"
KWOK="$CACHE/kwok-$KWOK_VERSION/kwok"
C="$STATE/certs"
URL="https://127.0.0.1:$API_PORT"
say() { echo "[kwok] $*"; }
api() { curl -sS --fail --max-time 30 --cacert "$C/ca.crt" --cert "$C/admin.crt" --key "$C/admin.key" "$@"; }
mkdir -p "$STATE"/{pids,logs,container-output}

# The Logs CRD first: kwok lists Logs objects when it starts.
api -X PATCH "$URL/apis/apiextensions.k8s.io/v1/customresourcedefinitions/logs.kwok.x-k8s.io?fieldManager=isthmus-stack&force=true" \
  -H "Content-Type: application/apply-patch+yaml" --data-binary @"$HERE/kwok-logs-crd.yaml" > /dev/null
for _ in $(seq 1 120); do
  api "$URL/apis/apiextensions.k8s.io/v1/customresourcedefinitions/logs.kwok.x-k8s.io" | tr -d ' \n' \
    | grep -q '"type":"Established","status":"True"' && break
  sleep 0.5
done

cp "$HERE/kwok-stages.yaml" "$STATE/kwok-stages.yaml"
cmd=("$KWOK" --kubeconfig "$STATE/kubeconfig" --manage-all-nodes=false
     --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake
     --config "$STATE/kwok-stages.yaml" --cidr 10.244.0.1/16 --node-ip 10.243.0.1
     --enable-crds=Logs --server-address "127.0.0.1:$KWOK_PORT" --node-port "$KWOK_PORT"
     --tls-cert-file "$C/apiserver.crt" --tls-private-key-file "$C/apiserver.key")
pidf="$STATE/pids/kwok.pid"
if [[ -f "$pidf" ]] && kill -0 "$(cat "$pidf")" 2>/dev/null; then
  running="$(tr '\0' ' ' < "/proc/$(cat "$pidf")/cmdline")"
  if [[ "$running" == "${cmd[*]} " ]]; then exit 0; fi
  say "restarting kwok (its command line changed)"
  pid="$(cat "$pidf")"; kill "$pid"
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
fi
# Someone else on kwok's port would answer the health check below and every pods/log read in
# its stead (404 for our Logs objects) while our kwok, unable to bind, still runs the pods.
holder="$(ss -Hltnp "sport = :$KWOK_PORT" 2>/dev/null || true)"
if [[ -n "$holder" ]]; then
  say "port $KWOK_PORT is already taken: $holder; stop that process (another checkout's stack/down.sh)"; exit 1
fi
say "starting kwok (kubelet server on 127.0.0.1:$KWOK_PORT)"
setsid nohup "${cmd[@]}" >> "$STATE/logs/kwok.log" 2>&1 < /dev/null &
echo $! > "$pidf"
for _ in $(seq 1 60); do
  kill -0 "$(cat "$pidf")" 2>/dev/null || { say "kwok exited at start (log: $STATE/logs/kwok.log)"; exit 1; }
  curl -sk --max-time 2 "https://127.0.0.1:$KWOK_PORT/healthz" > /dev/null 2>&1 && exit 0
  sleep 0.5
done
say "kwok's server did not answer on 127.0.0.1:$KWOK_PORT (log: $STATE/logs/kwok.log)"; exit 1
