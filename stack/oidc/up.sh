#!/usr/bin/env bash
# Start (or confirm) the local OpenID provider for tests: Keycloak in dev mode on
# 127.0.0.1:18080 with the realms in this directory (isthmus, isthmus-ci).
#   bash stack/oidc/up.sh            # start, import realms if missing, write the env file
#   bash stack/oidc/up.sh --reset    # stop, wipe the runtime state, start fresh
# Keycloak 26.7.3 runs on the Debian 12 OpenJDK 17 (checked), so nothing outside
# Debian's packages and Maven Central is needed. The distribution zip is fetched with
# mvn into ${ISTHMUS_CACHE:-/var/cache/isthmus}/oidc/ and unpacked there once; runtime
# state (H2 database, logs, PID, env file) lives in <repo>/.stack/oidc/.
# Idempotent: a second run finds the server by PID and only re-checks the realms.
# Env: ISTHMUS_KEYCLOAK_VERSION (26.7.3), ISTHMUS_OIDC_PORT (18080), JAVA_HOME.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"

if [ "${1:-}" = --reset ]; then
  bash "$HERE/down.sh"
  rm -rf "$STATE"
fi
mkdir -p "$STATE"/{log,tmp}
exec 9>"$STATE/.up.lock"
flock -w 600 9 || { log "another up.sh holds $STATE/.up.lock"; exit 1; }

# -------------------------------------------------------------------- packages
need=()
command -v curl >/dev/null || need+=(curl)
command -v unzip >/dev/null || need+=(unzip)
command -v python3 >/dev/null || need+=(python3)
command -v mvn >/dev/null || need+=(maven)
java_ok() { [ -x "$1/bin/java" ] && "$1/bin/java" -version 2>&1 | grep -qE 'version "(1[7-9]|[2-9][0-9])'; }
if [ -z "${JAVA_HOME:-}" ] || ! java_ok "$JAVA_HOME"; then
  JAVA_HOME=""
  for j in /usr/lib/jvm/java-17-openjdk-*; do java_ok "$j" && { JAVA_HOME=$j; break; }; done
  [ -n "$JAVA_HOME" ] || need+=(openjdk-17-jre-headless)
fi
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { log "missing ${need[*]}; run as root to install them"; exit 1; }
  log "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  if [ -z "${JAVA_HOME:-}" ]; then
    for j in /usr/lib/jvm/java-17-openjdk-*; do java_ok "$j" && { JAVA_HOME=$j; break; }; done
  fi
fi
export JAVA_HOME

# ------------------------------------------------------------------ distribution
if [ ! -x "$KC_HOME/bin/kc.sh" ]; then
  mkdir -p "$CACHE/dl"
  zip="$CACHE/dl/keycloak-quarkus-dist-$KC_VERSION.zip"
  if [ ! -s "$zip" ]; then
    log "downloading Keycloak $KC_VERSION (org.keycloak:keycloak-quarkus-dist, ~170 MB)"
    (cd "$CACHE" && mvn -q -B dependency:copy \
      -Dartifact="org.keycloak:keycloak-quarkus-dist:$KC_VERSION:zip" -DoutputDirectory="$CACHE/dl")
  fi
  tmp=$(mktemp -d "$CACHE/.unpack.XXXXXX")
  unzip -q "$zip" -d "$tmp"
  rm -rf "$KC_HOME"
  mv "$tmp/keycloak-$KC_VERSION" "$KC_HOME"
  rm -rf "$tmp"
fi

# ---------------------------------------------------------------------- server
if [ ! -s "$STATE/admin-password" ]; then
  # Only used on the first start of a fresh database (bootstrap admin of the master realm).
  head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$STATE/admin-password"
  chmod 600 "$STATE/admin-password"
fi
ADMIN_PASSWORD=$(cat "$STATE/admin-password")

if kc_alive; then
  log "Keycloak already running (pid $(cat "$PIDFILE"))"
else
  # Something else on our port would make every test talk to the wrong server.
  if curl -s -o /dev/null --max-time 2 "$BASE_URL/"; then
    log "port $PORT is taken by another process; set ISTHMUS_OIDC_PORT"; exit 1
  fi
  log "starting Keycloak $KC_VERSION on $BASE_URL (java: $JAVA_HOME)"
  t0=$(date +%s.%N)
  # C1-only JIT and a small heap: startup is what counts on a 2-core CI machine.
  JAVA_OPTS_APPEND="-XX:TieredStopAtLevel=1 -Djava.io.tmpdir=$STATE/tmp \
-Dquarkus.transaction-manager.object-store.directory=$STATE/transaction-logs" \
  KC_BOOTSTRAP_ADMIN_USERNAME=admin KC_BOOTSTRAP_ADMIN_PASSWORD="$ADMIN_PASSWORD" \
    setsid nohup "$KC_HOME/bin/kc.sh" start-dev \
      --http-host=127.0.0.1 --http-port="$PORT" --hostname="$BASE_URL" \
      --db=dev-file --db-url="jdbc:h2:file:$STATE/h2/keycloakdb;NON_KEYWORDS=VALUE" \
      --log=file --log-file="$STATE/log/keycloak.log" \
      </dev/null >"$STATE/log/stdout.log" 2>&1 9>&- &   # 9>&-: the server must not hold our lock
  echo $! >"$PIDFILE"
  deadline=$(( $(date +%s) + ${ISTHMUS_OIDC_START_TIMEOUT_S:-300} ))
  until curl -sf -o /dev/null --max-time 2 "$BASE_URL/realms/master/.well-known/openid-configuration"; do
    # Whether the process we just started is still there. Not kc_alive: until the forked
    # shell has exec'd kc.sh, its command line is this script's, and a check in that instant
    # took a starting Keycloak for a dead one (a clean-clone CI run, 2026-12-03).
    pid=$(cat "$PIDFILE")
    if [ ! -r "/proc/$pid/stat" ] || grep -q ') Z ' "/proc/$pid/stat"; then  # gone, or a zombie
      log "Keycloak exited during start; last log lines:"; tail -n 30 "$STATE/log/stdout.log" >&2; exit 1
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log "Keycloak not ready after ${ISTHMUS_OIDC_START_TIMEOUT_S:-300} s; last log lines:"
      tail -n 30 "$STATE/log/stdout.log" >&2; exit 1
    fi
    sleep 1
  done
  t1=$(date +%s.%N)
  python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$t0" "$t1" \
    >"$STATE/start-seconds"
  log "Keycloak ready in $(cat "$STATE/start-seconds") s"
fi

# ---------------------------------------------------------------------- realms
BASE_URL="$BASE_URL" ADMIN_PASSWORD="$ADMIN_PASSWORD" python3 "$HERE/realms.py" \
  "$HERE/realm-isthmus.json" "$HERE/realm-isthmus-ci.json"

# -------------------------------------------------------------------- env file
cat >"$STATE/env.tmp" <<EOF
# Written by stack/oidc/up.sh; read by tests/identity. Test credentials only.
OIDC_PROVIDER=keycloak
OIDC_PROVIDER_VERSION=$KC_VERSION
OIDC_BASE_URL=$BASE_URL
OIDC_ISSUER=$BASE_URL/realms/isthmus
OIDC_TOKEN_ENDPOINT=$BASE_URL/realms/isthmus/protocol/openid-connect/token
OIDC_CI_ISSUER=$BASE_URL/realms/isthmus-ci
OIDC_CI_TOKEN_ENDPOINT=$BASE_URL/realms/isthmus-ci/protocol/openid-connect/token
OIDC_AUDIENCE=isthmus
OIDC_CLIENT_ID=isthmus
OIDC_SHORT_CLIENT_ID=isthmus-short
OIDC_OTHER_AUDIENCE_CLIENT_ID=other-service
OIDC_CI_BOT_CLIENT_ID=ci-bot
OIDC_CI_BOT_CLIENT_SECRET=ci-bot-secret
OIDC_CI_RUNNER_CLIENT_ID=runner
OIDC_CI_RUNNER_CLIENT_SECRET=runner-secret
OIDC_USERS=alice,bob,carol,dave,root-admin
OIDC_CI_USERS=erin
OIDC_PASSWORD_SUFFIX=-password
OIDC_ADMIN_USER=admin
OIDC_ADMIN_PASSWORD=$ADMIN_PASSWORD
OIDC_ADMIN_TOKEN_ENDPOINT=$BASE_URL/realms/master/protocol/openid-connect/token
OIDC_ADMIN_API=$BASE_URL/admin/realms
OIDC_PID=$(cat "$PIDFILE")
OIDC_START_SECONDS=$(cat "$STATE/start-seconds" 2>/dev/null || echo unknown)
EOF
mv "$STATE/env.tmp" "$STATE/env"
log "env written to $STATE/env"
