#!/usr/bin/env bash
# Stop the local control plane started by up.sh, by the PIDs it recorded.
# State (etcd data, certs) is kept; pass --purge to delete it too.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="$(cd "$HERE/../.." && pwd)/.stack/kube"
for name in kwok kueue kube-scheduler kube-controller-manager kube-apiserver etcd; do
  f="$STATE/pids/$name.pid"
  [[ -f "$f" ]] || continue
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    echo "[kube down] stopped $name ($pid)"
  fi
  rm -f "$f"
done
rm -f "$STATE/env"
if [[ "${1:-}" == "--purge" ]]; then rm -rf "$STATE"; fi
