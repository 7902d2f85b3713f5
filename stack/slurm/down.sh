#!/usr/bin/env bash
# Stop one local Slurm cluster started by up.sh (by PID), keep its state and caches.
#   bash stack/slurm/down.sh 22.05     (or 24.11 / 25.11 / 26.05; "all" stops every version)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
[ "${1:-}" = all ] && { for v in 22.05 24.11 25.11 26.05; do bash "$0" "$v"; done; exit 0; }
VER="${1:-22.05}"
slurm_version_layout "$VER"
[ -d "$STATE" ] || { log "no state at $STATE: nothing to stop"; exit 0; }
CONF="$STATE/etc/slurm.conf"

if pid_alive "$STATE/run/slurmctld.pid" slurmctld; then
  # Cancel running jobs first so no job step outlives its slurmd.
  scancel=scancel; [ "$MODE" = prefix ] && scancel="$PREFIX/bin/scancel"
  timeout 10 "${CH[@]}" env SLURM_CONF="$CONF" "$scancel" --partition=gpu >/dev/null 2>&1 || true
  sleep 1
fi
stop_pidfile "$STATE/run/slurmrestd.pid" slurmrestd
for n in 1 2 3 4; do stop_pidfile "$STATE/run/slurmd-gpu$n.pid" slurmd; done
stop_pidfile "$STATE/run/slurmctld.pid" slurmctld
# Job step daemons of this cluster only: same root directory as the cluster's daemons.
want_root=/; [ "$MODE" = chroot ] && want_root=$ROOTFS
for p in /proc/[0-9]*; do
  [ "$(cat "$p/comm" 2>/dev/null)" = slurmstepd ] || continue
  [ "$(readlink "$p/root" 2>/dev/null)" = "$want_root" ] || continue
  # 22.05 and 25.11 both run on the host: tell them apart by the binary's location.
  exe=$(readlink "$p/exe" 2>/dev/null || true)
  if [ "$MODE" = prefix ]; then [[ "$exe" == "$PREFIX/"* ]] || continue
  elif [ "$MODE" = host ]; then [[ "$exe" == /usr/* ]] || continue; fi
  kill -KILL "${p#/proc/}" 2>/dev/null || true
done
stop_pidfile "$STATE/munge/munged.pid" munged
for n in 1 2 3 4; do stop_pidfile "$STATE/munge/munged-gpu$n.pid" munged; done  # 25.11
if [ "$MODE" = chroot ]; then
  # The chroot up.sh used (recorded in the state dir), else this environment's cache.
  roots=("$ROOTFS"); [ -s "$STATE/rootfs" ] && roots=("$(cat "$STATE/rootfs")" "$ROOTFS")
  for r in "${roots[@]}"; do
    for m in "$r$SHARED" "$r$STATE" "$r/dev" "$r/proc"; do
      if mountpoint -q "$m"; then umount "$m" 2>/dev/null || umount -l "$m"; fi
    done
  done
  for r in "${roots[@]}"; do
    if grep -q " $r/" /proc/mounts; then log "still mounted under $r (do not delete it)"; exit 1; fi
  done
fi
rm -f "$STATE/env"
log "down"
