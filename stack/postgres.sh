#!/usr/bin/env bash
# The test stack's own, throw-away PostgreSQL cluster: its own data directory (under
# .stack/postgres, or a per-checkout directory in /var/tmp when the postgres user cannot
# reach the checkout), its own port (ISTHMUS_PG_PORT, default 55432), loopback only.
# The machine's long-lived cluster (pg_ctlcluster 15 main) is never used or touched.
#
# ISTHMUS_PG_STATE=<dir> (with ISTHMUS_PG_PORT) runs a private server in <dir> instead, for a
# test that restarts or stops its server while other lanes use the stack's (tests/conftest.py
# own_postgres_server); its URL goes to <dir>/env.
# Usage: stack/postgres.sh [up|down|restart|status]. `up` is idempotent and prints the
# server URL (the `isthmus` maintenance database; tests and benchmarks create their own
# databases on it and drop them). The same URL is written to .stack/postgres/env.
# Removing .stack/ (with the server stopped) is a complete reset: the next `up` runs initdb.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
action=${1:-up}
ver=${PG_VERSION:-15}
port=${ISTHMUS_PG_PORT:-55432}
bin=/usr/lib/postgresql/$ver/bin
link=.stack/postgres
log() { printf '[postgres] %s\n' "$*" >&2; }

# Where the cluster lives. Postgres refuses to run as root, so the postgres user must be
# able to reach the directory; a checkout under /root is not reachable by it.
state_dir() {
  if [ -n "${ISTHMUS_PG_STATE:-}" ]; then  # a private server (a test that restarts it: tests/conftest.py)
    mkdir -p "$ISTHMUS_PG_STATE"; chmod 755 "$ISTHMUS_PG_STATE"; echo "$ISTHMUS_PG_STATE"; return
  fi
  if [ -L "$link" ]; then readlink -f "$link"; return; fi
  if [ -d "$link" ]; then echo "$REPO/$link"; return; fi
  mkdir -p .stack
  if su postgres -s /bin/sh -c "test -x '$REPO/.stack'" 2>/dev/null; then
    mkdir -p "$link"; echo "$REPO/$link"
  else
    local d
    d="/var/tmp/isthmus-postgres-$(printf '%s' "$REPO" | sha1sum | cut -c1-12)"
    rm -rf "$d"; mkdir -p "$d"; ln -s "$d" "$link"; echo "$d"
  fi
}

pgctl() { su postgres -s /bin/sh -c "$bin/pg_ctl -D '$DATA' $*"; }
running() { [ -d "${DATA:-/nonexistent}" ] && su postgres -s /bin/sh -c "$bin/pg_ctl -D '$DATA' status" >/dev/null 2>&1; }

if [ ! -x "$bin/initdb" ]; then
  [ "$action" = up ] || exit 0
  log "installing postgresql-$ver (server binaries only are used)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "postgresql-$ver" >/dev/null
fi

case $action in
  down|status|restart)
    [ -e "$link" ] || [ -n "${ISTHMUS_PG_STATE:-}" ] || { [ "$action" = down ] && exit 0; log "no cluster in $link"; exit 1; }
    DATA="$(state_dir)/data"
    case $action in
      down) running && pgctl "stop -m fast -w" >/dev/null; exit 0 ;;
      status) running && { echo "running"; exit 0; }; echo "stopped"; exit 3 ;;
      restart) pgctl "restart -m fast -w -l '$(state_dir)/postgres.log'" >/dev/null; exit 0 ;;
    esac ;;
  up) ;;
  *) echo "usage: $0 [up|down|restart|status]" >&2; exit 2 ;;
esac

STATE=$(state_dir); mkdir -p "$STATE"
DATA="$STATE/data"
chown postgres:postgres "$STATE"
if [ ! -s "$DATA/PG_VERSION" ]; then
  log "initdb $DATA (port $port)"
  rm -rf "$DATA"
  pwfile=$(mktemp); echo isthmus >"$pwfile"; chmod 644 "$pwfile"
  su postgres -s /bin/sh -c "$bin/initdb -D '$DATA' -U isthmus --pwfile='$pwfile' \
      --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8" >"$STATE/initdb.log" 2>&1 ||
    { rm -f "$pwfile"; tail -20 "$STATE/initdb.log" >&2; exit 1; }
  rm -f "$pwfile"
  mkdir -p "$STATE/run"; chown postgres:postgres "$STATE/run"
  cat >>"$DATA/postgresql.conf" <<EOF
# isthmus test stack (stack/postgres.sh)
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$STATE/run'
max_connections = 300
shared_buffers = 256MB
EOF
fi
if ! running; then
  pgctl "start -w -t 60 -l '$STATE/postgres.log'" >/dev/null ||
    { log "start failed; last log lines:"; tail -20 "$STATE/postgres.log" >&2; exit 1; }
fi
# The initdb superuser is `isthmus`; its maintenance database is made here once.
su postgres -s /bin/sh -c "$bin/psql -h '$STATE/run' -p $port -U isthmus -d postgres -qAtc \
  \"select 1 from pg_database where datname='isthmus'\"" | grep -q 1 ||
  su postgres -s /bin/sh -c "$bin/createdb -h '$STATE/run' -p $port -U isthmus isthmus"
url="postgresql+psycopg://isthmus:isthmus@127.0.0.1:$port/isthmus"
envfile=.stack/postgres/env
[ -n "${ISTHMUS_PG_STATE:-}" ] && envfile=$ISTHMUS_PG_STATE/env
printf 'ISTHMUS_TEST_POSTGRES_URL=%s\nISTHMUS_PG_PORT=%s\nISTHMUS_PG_DATA=%s\n' "$url" "$port" "$DATA" >"$envfile"
echo "$url"
