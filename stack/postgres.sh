#!/usr/bin/env bash
# Start the machine's PostgreSQL 15 on loopback and make the test role. Idempotent.
# Usage: stack/postgres.sh [up|down]. Prints the DSN tests use.
set -euo pipefail
action=${1:-up}
ver=${PG_VERSION:-15}
if [ "$action" = down ]; then
  pg_ctlcluster "$ver" main stop 2>/dev/null || true
  exit 0
fi
if ! command -v pg_ctlcluster >/dev/null || [ ! -d "/etc/postgresql/$ver/main" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "postgresql-$ver" >/dev/null
fi
if ! pg_ctlcluster "$ver" main status >/dev/null 2>&1; then
  pg_ctlcluster "$ver" main start
fi
for _ in $(seq 1 60); do
  su postgres -c "psql -qAtc 'select 1'" >/dev/null 2>&1 && break
  sleep 0.5
done
su postgres -c "psql -qAtc \"select 1 from pg_roles where rolname='isthmus'\"" | grep -q 1 ||
  su postgres -c "psql -qc \"CREATE ROLE isthmus LOGIN SUPERUSER PASSWORD 'isthmus'\""
su postgres -c "psql -qAtc \"select 1 from pg_database where datname='isthmus'\"" | grep -q 1 ||
  su postgres -c "createdb -O isthmus isthmus"
# Benchmarks and many test processes open many connections.
cur=$(su postgres -c "psql -qAtc 'show max_connections'")
if [ "$cur" -lt 300 ]; then
  su postgres -c "psql -qc 'ALTER SYSTEM SET max_connections = 300'"
  pg_ctlcluster "$ver" main restart
fi
echo "postgresql+psycopg://isthmus:isthmus@127.0.0.1:5432/isthmus"
