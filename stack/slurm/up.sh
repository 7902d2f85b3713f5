#!/usr/bin/env bash
# Start (or confirm) a local multi-node Slurm cluster of one version:
#   bash stack/slurm/up.sh 22.05   # Debian 12 host packages
#   bash stack/slurm/up.sh 24.11   # Debian 13 (trixie) chroot, cached
#   bash stack/slurm/up.sh 26.05   # Debian unstable (sid) chroot, cached
#   bash stack/slurm/up.sh 25.11   # built from source on the host (build-25.11.sh), cached
# One slurmctld, slurmd gpu[1-4] (8 fake GPUs each), slurmrestd with JWT, own munged,
# own ports. Runtime state goes to .stack/slurm-<ver>/ (the env file tests read);
# downloaded/built things go to ${ISTHMUS_CACHE:-/var/cache/isthmus}/slurm-<ver>/.
# Idempotent: a second run finds the daemons by PID and only re-checks node state.
set -euo pipefail
VER="${1:-22.05}"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
slurm_version_layout "$VER"
[ "$(id -u)" = 0 ] || { log "must run as root (starts slurmd, creates users)"; exit 1; }

source "$HERE/../users.sh"
# shellcheck disable=SC2206  # word splitting intended
TEST_USERS=($STACK_USERS slurmrest:2010)
CONF="$STATE/etc/slurm.conf"
mkdir -p "$STATE" "$CACHE"
# Daemons started below get "9>&-" so they do not inherit (and hold) this lock.
exec 9>"$STATE/.up.lock"
flock -w 600 9 || { log "another up.sh holds $STATE/.up.lock"; exit 1; }

# ------------------------------------------------------------------ packages / rootfs
if [ "$MODE" = host ]; then
  apt_install slurm-wlm slurmrestd munge
  dpkg-query -W -f='${Version}\n' slurmctld >"$CACHE/slurm-package-version"
elif [ "$MODE" = prefix ]; then
  # Cached: a no-op once built. pyslurm goes into the repository's .venv when there is
  # one (what `make test` reaches), or into ISTHMUS_PYSLURM_VENV; set that empty to skip.
  PYSLURM_VENV=${ISTHMUS_PYSLURM_VENV-$REPO_ROOT/.venv}
  if [ -n "$PYSLURM_VENV" ] && [ -x "$PYSLURM_VENV/bin/pip" ]; then
    bash "$HERE/build-$VER.sh" --pyslurm "$PYSLURM_VENV"
  else
    bash "$HERE/build-$VER.sh"
  fi
  apt_install munge
  ( flock -w 300 8 && { getent group slurm >/dev/null || groupadd --system slurm; } &&
    { getent passwd slurm >/dev/null || useradd --system -g slurm -M -d /nonexistent -s /usr/sbin/nologin slurm; }
  ) 8>/var/lock/isthmus-users.lock
  "$PREFIX/sbin/slurmctld" -V | awk '{print $2}' >"$CACHE/slurm-package-version"
else
  apt_install debootstrap
  ensure_rootfs
  cp /etc/hosts "$ROOTFS/etc/hosts"
fi
PKG_VERSION=$(cat "$CACHE/slurm-package-version")
case "$PKG_VERSION" in
  "$VER".*) ;;
  *) log "expected Slurm $VER but the packages carry $PKG_VERSION"; exit 1 ;;
esac

# ----------------------------------------------------------------------- users
ensure_users() {  # runs in the host or inside the chroot via "${CH[@]}"
  local spec name uid
  for spec in "${TEST_USERS[@]}"; do
    name=${spec%%:*}; uid=${spec##*:}
    "${CH[@]}" getent group "$name" >/dev/null || "${CH[@]}" groupadd -g "$uid" "$name"
    "${CH[@]}" getent passwd "$name" >/dev/null || \
      "${CH[@]}" useradd -M -d /nonexistent -s /bin/sh -u "$uid" -g "$uid" "$name"
  done
}
# The host's users are shared by the chains of stack/up.sh that run side by side: useradd
# refuses while another holds /etc/passwd, so the host's part takes a machine-wide lock.
CH_SAVE=("${CH[@]}"); CH=()
( flock -w 300 8 && ensure_users ) 8>/var/lock/isthmus-users.lock
CH=("${CH_SAVE[@]}")
[ "$MODE" = chroot ] && ensure_users

# ---------------------------------------------------------------------- mounts
if [ "$MODE" = chroot ]; then
  mountpoint -q "$ROOTFS/proc" || mount --bind /proc "$ROOTFS/proc"
  # A private /dev with the few nodes the daemons use, never a bind of the host's /dev:
  # a bind would let an rm -rf of the cache delete the host's device nodes.
  if ! mountpoint -q "$ROOTFS/dev"; then
    mount -t tmpfs -o mode=755,size=1m isthmus-slurm-dev "$ROOTFS/dev"
    for spec in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
      IFS=: read -r n ma mi <<<"$spec"; mknod -m 666 "$ROOTFS/dev/$n" c "$ma" "$mi"
    done
    ln -s /proc/self/fd "$ROOTFS/dev/fd"
    for i in 0 1 2; do ln -s "/proc/self/fd/$i" "$ROOTFS/dev/$(echo stdin stdout stderr | cut -d' ' -f$((i + 1)))"; done
    mkdir -m 1777 "$ROOTFS/dev/shm"
  fi
  # The state dir appears at the same path inside, so every path in slurm.conf,
  # the env file and job output is valid on both sides.
  mkdir -p "$ROOTFS$STATE"
  mountpoint -q "$ROOTFS$STATE" || mount --bind "$STATE" "$ROOTFS$STATE"
  mkdir -p -m 1777 "$SHARED" "$ROOTFS$SHARED"
  mountpoint -q "$ROOTFS$SHARED" || mount --bind "$SHARED" "$ROOTFS$SHARED"
  echo "$ROOTFS" >"$STATE/rootfs"   # down.sh unmounts this even if ISTHMUS_CACHE differs
fi

# ------------------------------------------------------------------ state dirs
mkdir -p -m 1777 "$SHARED"; chmod 1777 "$SHARED"   # every test user makes its directories here
mkdir -p "$STATE"/{etc,log,run,spool,dev,work} "$STATE/munge" "$STATE/ctld" "$STATE/jwt"
chmod 755 "$STATE" "$STATE"/{etc,log,run,spool,dev}
chmod 1777 "$STATE/work"   # shared output dir for every test user
"${CH[@]}" chown slurm:slurm "$STATE/ctld" "$STATE/jwt"
chmod 700 "$STATE/jwt"
for i in 0 1 2 3 4 5 6 7; do   # fake GPUs: gres needs a device file per GPU
  [ -c "$STATE/dev/nvidia$i" ] || { rm -f "$STATE/dev/nvidia$i"; mknod "$STATE/dev/nvidia$i" c 1 3; }
done
touch "$STATE/log/slurmctld.log"; "${CH[@]}" chown slurm:slurm "$STATE/log/slurmctld.log"

# ------------------------------------------------------------------------ keys
if [ ! -s "$STATE/munge/munge.key" ]; then
  head -c 1024 /dev/urandom >"$STATE/munge/munge.key"
fi
"${CH[@]}" chown -R munge:munge "$STATE/munge"
chmod 700 "$STATE/munge"; chmod 600 "$STATE/munge/munge.key"
# munge's socket directory must be reachable by every user that submits.
chmod 755 "$STATE/munge"
JWT_KEY="$STATE/jwt/jwt_hs256.key"
if [ ! -s "$JWT_KEY" ]; then head -c 32 /dev/urandom >"$JWT_KEY"; fi
"${CH[@]}" chown slurm:slurm "$JWT_KEY"; chmod 600 "$JWT_KEY"

# ---------------------------------------------------------------------- config
# Debian builds Slurm with --enable-multiple-slurmd, so four slurmd may share the host name
# "localhost". A plain source build (25.11) refuses duplicate host names ("Duplicated
# NodeHostName"; the other nodes never get an address): give each node its own loopback
# address instead (all of 127.0.0.0/8 is local on Linux), which works with any build.
# Such a build also rejects a munge credential decoded twice by one munged ("Replayed
# credential": srun's launch request reaches every node), so each node gets its own munged
# (same key, own socket, hence its own slurm-gpu<n>.conf differing only in AuthInfo), as
# each host of a real cluster has.
if [ "$MODE" = prefix ]; then
  NODE_ADDRESSES="NodeHostname=gpu[1-4] NodeAddr=127.0.0.[1-4]"
  MUNGE_SOCKETS=(munge gpu1 gpu2 gpu3 gpu4)
else
  NODE_ADDRESSES="NodeHostname=localhost"
  MUNGE_SOCKETS=(munge)
fi
write_conf() {
  cat <<CONF
# Generated by stack/slurm/up.sh $VER — local test cluster, do not edit by hand.
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge/munge.socket
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# Nodes declare more CPUs/memory than this machine has; no cgroups available.
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
MpiDefault=none
# Reject at submit time what the partition can never run (else it pends forever).
EnforcePartLimits=ALL
ReturnToService=2
# Fast turnaround for tests: finished jobs stay visible 5 min, quick kill and backfill.
MinJobAge=300
KillWait=2
OverTimeLimit=0
InactiveLimit=0
Waittime=0
MessageTimeout=10
SlurmdTimeout=60
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2,sched_min_interval=200000
NodeName=gpu[1-4] $NODE_ADDRESSES Port=[$SLURMD_PORT0-$SLURMD_PORT_LAST] CPUs=8 RealMemory=64000 Gres=gpu:8 State=UNKNOWN
PartitionName=gpu Nodes=gpu[1-4] Default=YES MaxTime=INFINITE State=UP
TopologyPlugin=topology/$TOPOLOGY
CONF
  # Slurm 25.11 serves OpenMetrics over HTTP on slurmctld's own port (GET /metrics/...).
  [ "$VER" = 25.11 ] && echo "MetricsType=metrics/openmetrics"
  # The per-node copies differ in AuthInfo only; do not log that as a config mismatch.
  [ "$MODE" = prefix ] && echo "DebugFlags=NO_CONF_HASH"
  return 0
}
# A network topology of two domains of two nodes (issue #31, docs/planning.md): blocks
# (topology/block, Slurm 23.11+) where the version has them, leaf switches under one top
# switch (topology/tree) on 22.05. Gangs that ask for one domain get --segment / --switches.
if [ "$VER" = 22.05 ]; then
  TOPOLOGY=tree
  printf 'SwitchName=s1 Nodes=gpu[1-2]\nSwitchName=s2 Nodes=gpu[3-4]\nSwitchName=top Switches=s[1-2]\n' \
    >"$STATE/etc/topology.conf.new"
else
  TOPOLOGY=block
  printf 'BlockName=b1 Nodes=gpu[1-2]\nBlockName=b2 Nodes=gpu[3-4]\nBlockSizes=2,4\n' >"$STATE/etc/topology.conf.new"
fi
write_conf >"$CONF.new"
printf 'AutoDetect=off\nNodeName=gpu[1-4] Name=gpu File=%s/dev/nvidia[0-7]\n' "$STATE" >"$STATE/etc/gres.conf"
# Slurm >= 23.02 reads cgroup.conf even with proctrack/linuxproc; no cgroups here.
[ "$MODE" != host ] && echo "CgroupPlugin=disabled" >"$STATE/etc/cgroup.conf"
chmod 644 "$STATE"/etc/*

stop_cluster_daemons() {
  stop_pidfile "$STATE/run/slurmrestd.pid" slurmrestd
  for n in 1 2 3 4; do stop_pidfile "$STATE/run/slurmd-gpu$n.pid" slurmd; done
  stop_pidfile "$STATE/run/slurmctld.pid" slurmctld
}
if [ -f "$CONF" ] && { ! cmp -s "$CONF" "$CONF.new" || ! cmp -s "$STATE/etc/topology.conf" "$STATE/etc/topology.conf.new"; }; then
  log "slurm.conf or topology.conf changed: restarting daemons"
  stop_cluster_daemons
fi
mv "$STATE/etc/topology.conf.new" "$STATE/etc/topology.conf"
mv "$CONF.new" "$CONF"
slurmd_conf() { if [ "$MODE" = prefix ]; then echo "$STATE/etc/slurm-gpu$1.conf"; else echo "$CONF"; fi; }
if [ "$MODE" = prefix ]; then
  for n in 1 2 3 4; do
    sed "s|^AuthInfo=socket=.*|AuthInfo=socket=$STATE/munge/gpu$n.socket|" "$CONF" >"$(slurmd_conf $n).new"
    if [ -f "$(slurmd_conf $n)" ] && ! cmp -s "$(slurmd_conf $n)" "$(slurmd_conf $n).new"; then
      stop_pidfile "$STATE/run/slurmd-gpu$n.pid" slurmd
    fi
    mv "$(slurmd_conf $n).new" "$(slurmd_conf $n)"; chmod 644 "$(slurmd_conf $n)"
  done
fi

# --------------------------------------------------------------------- daemons
RUN_ENV=(env SLURM_CONF="$CONF")
# Where this version's daemons and commands are: the distribution's, or the built prefix.
SBIN=/usr/sbin; BINDIR=""
if [ "$MODE" = prefix ]; then
  SBIN="$PREFIX/sbin"; BINDIR="$PREFIX/bin"
  RUN_ENV+=(PATH="$BINDIR:$SBIN:/usr/sbin:/usr/bin:/sbin:/bin")
fi
for m in "${MUNGE_SOCKETS[@]}"; do
  sfx=""; [ "$m" = munge ] || sfx="-$m"
  if ! pid_alive "$STATE/munge/munged$sfx.pid" munged; then
    log "starting munged$sfx"
    "${CH[@]}" runuser -u munge -- /usr/sbin/munged --force \
      --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/$m.socket" \
      --pid-file="$STATE/munge/munged$sfx.pid" --log-file="$STATE/munge/munged$sfx.log" \
      --seed-file="$STATE/munge/munged$sfx.seed" 9>&-
  fi
done
if ! pid_alive "$STATE/run/slurmctld.pid" slurmctld; then
  log "starting slurmctld on port $CTLD_PORT"
  "${CH[@]}" "${RUN_ENV[@]}" "$SBIN/slurmctld" -f "$CONF" 9>&-
fi
for n in 1 2 3 4; do
  if ! pid_alive "$STATE/run/slurmd-gpu$n.pid" slurmd; then
    log "starting slurmd gpu$n"
    "${CH[@]}" "${RUN_ENV[@]}" "$SBIN/slurmd" -f "$(slurmd_conf $n)" -N "gpu$n" 9>&-
  fi
done

if [ "$MODE" = host ]; then REST_PLUGINS=v0.0.38; else REST_PLUGINS=openapi/slurmctld; fi
if ! pid_alive "$STATE/run/slurmrestd.pid" slurmrestd; then
  log "starting slurmrestd on 127.0.0.1:$REST_PORT ($REST_PLUGINS)"
  # slurmrestd does not daemonize; it runs as an unprivileged user and only forwards
  # the caller's token, so it never holds the JWT key.
  (
    cd /
    setsid "${CH[@]}" env SLURM_CONF="$CONF" SLURM_JWT=daemon \
      "$SBIN/slurmrestd" -f "$CONF" -u slurmrest -g slurmrest -a rest_auth/jwt \
      -s "$REST_PLUGINS" "127.0.0.1:$REST_PORT" \
      </dev/null >>"$STATE/log/slurmrestd.log" 2>&1 9>&- &
    echo $! >"$STATE/run/slurmrestd.pid"
  )
fi

# ---------------------------------------------------------- wait for the nodes
CLI=("${CH[@]}" "${RUN_ENV[@]}")
deadline=$((SECONDS + ${ISTHMUS_SLURM_UP_TIMEOUT_S:-90}))
while :; do
  states=$("${CLI[@]}" sinfo -h -N -p gpu -o '%N %t' 2>/dev/null | sort -u || true)
  ready=$(printf '%s\n' "$states" | awk '$2 ~ /^(idle|alloc|mix|comp)$/' | wc -l)
  [ "$ready" -ge 4 ] && break
  if printf '%s\n' "$states" | grep -Eq ' (down|drain|drng|fail|inval)'; then
    "${CLI[@]}" scontrol update nodename=gpu[1-4] state=resume >/dev/null 2>&1 || true
  fi
  if [ $SECONDS -ge $deadline ]; then
    log "nodes not ready: $(echo $states)"; log "see $STATE/log/"; exit 1
  fi
  sleep 1
done
deadline=$((SECONDS + 30))
# bash's /dev/tcp: a fresh Debian has no curl.
until (exec 3<>"/dev/tcp/127.0.0.1/$REST_PORT") 2>/dev/null; do
  pid_alive "$STATE/run/slurmrestd.pid" slurmrestd || { log "slurmrestd died:"; tail -5 "$STATE/log/slurmrestd.log" >&2; exit 1; }
  [ $SECONDS -ge $deadline ] && { log "slurmrestd not answering"; exit 1; }
  sleep 0.5
done

# -------------------------------------------------------------------- env file
q() { printf "'%s'" "$1"; }   # values never contain single quotes
{
  echo "SLURM_VERSION=$(q "$VER")"
  echo "SLURM_PACKAGE_VERSION=$(q "$PKG_VERSION")"
  echo "SLURM_MODE=$(q "$MODE")"
  echo "SLURM_CHROOT=$(q "$([ "$MODE" = chroot ] && echo "$ROOTFS")")"
  echo "SLURM_CLI_PREFIX=$(q "${CH[*]}")"
  echo "SLURM_CONF=$(q "$CONF")"
  echo "SLURMRESTD_URL=$(q "http://127.0.0.1:$REST_PORT")"
  echo "SLURM_JWT_KEY=$(q "$JWT_KEY")"
  echo "SLURM_JWT_USER=$(q slurm)"
  echo "SLURM_PARTITION=$(q gpu)"
  echo "SLURM_NODES=$(q 'gpu[1-4]')"
  echo "SLURM_GPUS_PER_NODE=$(q 8)"
  echo "SLURM_WORK_DIR=$(q "$STATE/work")"
  echo "SLURM_TEST_USERS=$(q "$(printf '%s\n' $STACK_USERS | cut -d: -f1 | paste -sd,)")"
  # Their uids: a Kubernetes pool maps the same users to the same uids (its uid_map).
  echo "SLURM_TEST_UIDS=$(q "$(printf '%s\n' $STACK_USERS | tr : = | paste -sd,)")"
  echo "SLURM_CTLD_PORT=$(q "$CTLD_PORT")"
  echo "SLURM_STACK_DIR=$(q "$STATE")"
  # Only for a cluster whose commands are not on the default PATH (a built prefix).
  if [ -n "$BINDIR" ]; then echo "SLURM_BIN_DIR=$(q "$BINDIR")"; fi
  if [ "$VER" = 25.11 ]; then echo "SLURM_METRICS_URL=$(q "http://127.0.0.1:$CTLD_PORT/metrics")"; fi
} >"$STATE/env.new"
mv "$STATE/env.new" "$STATE/env"
log "up: $("${CLI[@]}" sinfo -h -p gpu -o '%P %D %t %N' | tr '\n' ' ')— env: $STATE/env"
