# Shared by up.sh and down.sh. Paths come from the repository this script lives in.
# shellcheck shell=bash
REPO=$(cd "$HERE/../.." && pwd)
STATE="$REPO/.stack/oidc"
CACHE="${ISTHMUS_CACHE:-/var/cache/isthmus}/oidc"
KC_VERSION="${ISTHMUS_KEYCLOAK_VERSION:-26.7.3}"
KC_HOME="$CACHE/keycloak-$KC_VERSION"
PORT="${ISTHMUS_OIDC_PORT:-18080}"
BASE_URL="http://127.0.0.1:$PORT"
PIDFILE="$STATE/keycloak.pid"

log() { echo "stack/oidc: $*" >&2; }

# True when the PID file names a live Keycloak JVM started from our state (not a
# recycled PID of some other process).
kc_alive() {
  local pid
  [ -s "$PIDFILE" ] || return 1
  pid=$(cat "$PIDFILE")
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$STATE/h2/keycloakdb"
}
