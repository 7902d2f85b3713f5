#!/usr/bin/env bash
# Put the test stack back to fresh state, keeping only build caches.
#
# Stops what this checkout's stack/up.sh started, then deletes every piece of state the
# stack keeps, so the next stack/up.sh starts from nothing:
#   - .stack/ (the throw-away Postgres cluster and its databases, Slurm state/spool/logs,
#     Keycloak's H2 database, etcd's data, certificates, env files);
#   - the test users (alice, bob, carol, slurmrest) on the host and inside the cached
#     Slurm chroots (they have no home directories: jobs write under .stack);
#   - bind mounts that an earlier checkout left inside the cached chroots.
# What stays is what ISTHMUS_CACHE (default /var/cache/isthmus) holds: downloaded
# distributions, built binaries, the debootstrapped chroots (docs/testing.md).
# .ci/run calls this first, so CI always runs from fresh state.
#
# The test users and the chroots are the machine's, not this checkout's: resetting while
# another checkout's stack (or its CI run) is up would remove the users that stack's daemons
# and jobs run as. So the script first looks for such a stack and refuses (exit 1, nothing
# changed) when it finds one; see the guard below.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
CACHE=${ISTHMUS_CACHE:-/var/cache/isthmus}
log() { printf '[reset] %s\n' "$*" >&2; }

# Guard: another checkout's stack (or CI run) still up on this machine would lose its test
# users and chroot mounts. Its daemons carry their checkout's .stack/ path on their command
# lines (slurmctld -f <checkout>/.stack/..., postgres -D ..., Keycloak's H2 path). Refuse,
# name them, change nothing. ISTHMUS_RESET_FORCE=1 overrides (after you ended them).
stack_users() {
  local f
  for f in /proc/[0-9]*/cmdline; do
    { tr '\0' ' ' < "$f"; } 2>/dev/null; echo
  done | grep -o '/[^ =:]*/\.stack/' | sort -u
}
others=$(stack_users | grep -vxF "$REPO/.stack/" || true)
if [ -n "$others" ] && [ "${ISTHMUS_RESET_FORCE:-0}" != 1 ]; then
  log "another checkout's stack is running (processes use: $(echo $others)); stop it with"
  log "its stack/down.sh first, or set ISTHMUS_RESET_FORCE=1. Nothing was changed."
  exit 1
fi

bash stack/down.sh >/dev/null 2>&1
bash stack/postgres.sh down >/dev/null 2>&1

# Daemons of this checkout's path that down.sh did not know of: an earlier clone at the same
# path whose .stack/ (with its PID files) is gone, or a down.sh that stopped half-way. Left
# running, they hold the stack's ports and the next up.sh talks to them (a CI run once found
# an old kube-apiserver on its port and waited for CRDs that were never its own).
stale() {
  local f pid c
  for f in /proc/[0-9]*/cmdline; do
    pid=${f#/proc/}; pid=${pid%/cmdline}
    [ "$pid" = $$ ] && continue
    c=$(tr '\0' ' ' 2>/dev/null < "$f") || continue
    case $c in *"$REPO/.stack/"*) echo "$pid" ;; esac
  done
}
pids=$(stale)
if [ -n "$pids" ]; then
  log "stopping this checkout's leftover daemons: $(echo $pids)"
  kill $pids 2>/dev/null
  for _ in $(seq 1 50); do [ -n "$(stale)" ] || break; sleep 0.2; done
  pids=$(stale); [ -z "$pids" ] || kill -9 $pids 2>/dev/null
fi

# Private Postgres servers of tests that restart theirs (tests/conftest.py own_postgres_server)
# that an interrupted run left: their daemons and their directories.
for d in /var/tmp/isthmus-pg-private-*; do
  [ -d "$d" ] || continue
  pkill -f -- "-D $d/data" 2>/dev/null
  sleep 0.5; pkill -KILL -f -- "-D $d/data" 2>/dev/null
  rm -rf "$d"
done

# The Postgres cluster may live outside the checkout (stack/postgres.sh: /var/tmp/...).
if [ -L .stack/postgres ]; then
  target=$(readlink -f .stack/postgres)
  case $target in /var/tmp/isthmus-postgres-*) rm -rf "$target" ;; esac
fi

# Stale bind mounts inside the cached chroots (a checkout's .stack mounted at the same
# path inside, see stack/slurm/up.sh). Only mounts below the chroots are touched.
for root in "$CACHE"/slurm-*/root; do
  [ -d "$root" ] || continue
  awk -v r="$root/" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
  done
done
if grep -q " $CACHE/slurm-[^ ]*/root/" /proc/mounts; then
  log "mounts remain below $CACHE; not deleting state"; exit 1
fi

rm -rf .stack

# Test users: created again by stack/slurm/up.sh (host and chroots).
for u in alice bob carol slurmrest; do
  if getent passwd "$u" >/dev/null; then
    pkill -KILL -u "$u" 2>/dev/null
    userdel "$u" >/dev/null 2>&1 || log "could not remove user $u"
  fi
  getent group "$u" >/dev/null && groupdel "$u" >/dev/null 2>&1
  for root in "$CACHE"/slurm-*/root; do
    [ -x "$root/usr/sbin/userdel" ] || continue
    chroot "$root" userdel "$u" >/dev/null 2>&1
    chroot "$root" groupdel "$u" >/dev/null 2>&1
  done
done
log "fresh state: .stack/ removed, test users removed, caches kept in $CACHE"
exit 0
