#!/usr/bin/env bash
# Stop the local control plane started by up.sh, by the PIDs it recorded.
# State (etcd data, certs) is kept; pass --purge to delete it too.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="$(cd "$HERE/../.." && pwd)/.stack/kube"
# The real node first (node.sh): the kubelet, then its containers, then containerd.
NODE_RUN=/run/isthmus-containerd
stop_pid() { # name
  local f="$STATE/pids/$1.pid" pid
  [[ -f "$f" ]] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    echo "[kube down] stopped $1 ($pid)"
  fi
  rm -f "$f"
}
stop_pid kubelet
if [[ -d "$NODE_RUN/runc/k8s.io" ]] && command -v runc >/dev/null; then
  for id in $(runc --root "$NODE_RUN/runc/k8s.io" list -q 2>/dev/null); do
    runc --root "$NODE_RUN/runc/k8s.io" kill -a "$id" KILL 2>/dev/null || true
    runc --root "$NODE_RUN/runc/k8s.io" delete -f "$id" 2>/dev/null || true
  done
fi
pkill -f "containerd-shim-runc-v2 .*-address $NODE_RUN/containerd.sock" 2>/dev/null || true
stop_pid containerd
# Mounts the kubelet and containerd left (pod volumes, sandbox rootfs, netns); deepest first.
if [[ -d "$STATE/node" ]]; then
  node_dir="$(cd -P "$STATE/node" && pwd)"
  # grep finds none once the node has no pod left: not a failure (set -e + pipefail stopped
  # this script here once, leaving the API server, Kueue and kwok running).
  awk '{print $2}' /proc/mounts | { grep -E "^($node_dir|$NODE_RUN|/run/netns/cni-)" || true; } | sort -r \
    | while read -r m; do umount -l "$m" 2>/dev/null || true; done
fi
ip addr del "${ISTHMUS_KUBE_NODE_IP:-10.246.0.1}/32" dev lo 2>/dev/null || true  # absent: nothing to do
rm -f "$STATE/node.env"

for name in kwok kueue kube-scheduler kube-controller-manager kube-apiserver etcd; do
  stop_pid "$name"
done
rm -f "$STATE/env"
if [[ "${1:-}" == "--purge" ]]; then rm -rf "$STATE"; fi
