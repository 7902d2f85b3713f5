#!/usr/bin/env bash
# Stop the local OpenID provider started by up.sh (by PID); keep its state and caches.
#   bash stack/oidc/down.sh
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
rm -f "$STATE/env"
if ! kc_alive; then
  rm -f "$PIDFILE"; log "not running"; exit 0
fi
pid=$(cat "$PIDFILE")
kill -TERM "$pid" 2>/dev/null || true
for _ in $(seq 1 30); do
  kc_alive || break
  sleep 1
done
if kc_alive; then
  log "pid $pid ignored SIGTERM for 30 s; killing"; kill -KILL "$pid" 2>/dev/null || true
fi
rm -f "$PIDFILE"
log "down"
