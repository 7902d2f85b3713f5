# Shared helpers for stack/slurm/up.sh and down.sh. Sourced, not executed.
# shellcheck shell=bash

# Per-version layout. Ports are fixed so several versions can run side by side.
slurm_version_layout() {
  case "$1" in
    22.05) MODE=host;   SUITE="";      CTLD_PORT=16817; SLURMD_PORT0=17001; REST_PORT=16820 ;;
    24.11) MODE=chroot; SUITE=trixie;  CTLD_PORT=16917; SLURMD_PORT0=17101; REST_PORT=16920 ;;
    26.05) MODE=chroot; SUITE=sid;     CTLD_PORT=17017; SLURMD_PORT0=17201; REST_PORT=17020 ;;
    # Built from source (stack/slurm/build-25.11.sh), runs on the host from its prefix.
    25.11) MODE=prefix; SUITE="";      CTLD_PORT=17317; SLURMD_PORT0=17301; REST_PORT=17320 ;;
    *) echo "unsupported Slurm version '$1' (use 22.05, 24.11, 25.11 or 26.05)" >&2; return 2 ;;
  esac
  SLURMD_PORT_LAST=$((SLURMD_PORT0 + 3))
  REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  STATE="$REPO_ROOT/.stack/slurm-$1"
  # The clusters' one shared file system (docs/storage.md): the same directory, at the same
  # path, on the host clusters and inside every chroot cluster (bind-mounted), as a site's
  # Lustre or NFS is on all its clusters. Storages in the tests live under it.
  SHARED="$REPO_ROOT/.stack/shared"
  CACHE="${ISTHMUS_CACHE:-/var/cache/isthmus}/slurm-$1"
  ROOTFS="$CACHE/root"
  PREFIX="$CACHE/prefix"   # MODE=prefix: where build-<ver>.sh installed Slurm
  CLUSTER="isthmus${1//./}"
  if [ "$MODE" = chroot ]; then CH=(chroot "$ROOTFS"); else CH=(); fi
}

log() { printf '[slurm-%s] %s\n' "${VER:-?}" "$*" >&2; }

# The Debian mirror this machine already uses, read from its own apt sources so no
# mirror host is written into the repository. ISTHMUS_DEBIAN_MIRROR overrides.
debian_mirror() {
  if [ -n "${ISTHMUS_DEBIAN_MIRROR:-}" ]; then echo "$ISTHMUS_DEBIAN_MIRROR"; return; fi
  local codename uri f
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  # one-line format: deb [opts] URI SUITE COMPONENTS...
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    uri=$(awk -v s="$codename" '
      $1=="deb" { i=2; if ($2 ~ /^\[/) { while (i<=NF && $i !~ /\]$/) i++; i++ }
                  if ($(i+1)==s) { print $i; exit } }' "$f")
    [ -n "$uri" ] && { echo "${uri%/}"; return; }
  done
  # deb822 format: stanzas separated by blank lines
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    uri=$(awk -v s="$codename" '
      BEGIN { RS=""; FS="\n" }
      { types=""; suites=""; uris=""; enabled="yes"
        for (i=1;i<=NF;i++) { l=$i; if (l ~ /^#/) continue
          if (l ~ /^Types:/)   { sub(/^Types:[ \t]*/,"",l); types=l }
          if (l ~ /^Suites:/)  { sub(/^Suites:[ \t]*/,"",l); suites=" " l " " }
          if (l ~ /^URIs:/)    { sub(/^URIs:[ \t]*/,"",l); uris=l }
          if (l ~ /^Enabled:/) { sub(/^Enabled:[ \t]*/,"",l); enabled=l } }
        if (enabled!="no" && types ~ /(^| )deb( |$)/ && index(suites," " s " ")) {
          split(uris,u," "); print u[1]; exit } }' "$f")
    [ -n "$uri" ] && { echo "${uri%/}"; return; }
  done
  echo "no Debian mirror for '$codename' found in /etc/apt/sources.list{,.d}; set ISTHMUS_DEBIAN_MIRROR" >&2
  return 1
}

pid_alive() {  # pidfile expected-comm-prefix
  local pid
  [ -s "$1" ] || return 1
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  case "$(cat "/proc/$pid/comm" 2>/dev/null)" in "$2"*) return 0 ;; esac
  return 1
}

stop_pidfile() {  # pidfile comm-prefix
  local pid i
  pid_alive "$1" "$2" || { rm -f "$1"; return 0; }
  pid=$(cat "$1")
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 50); do pid_alive "$1" "$2" || break; sleep 0.2; done
  if pid_alive "$1" "$2"; then kill -KILL "$pid" 2>/dev/null || true; sleep 0.2; fi
  rm -f "$1"
}

# Build (once) the Debian chroot that carries this Slurm version. Cached outside the
# repository so a fresh clone on the same machine reuses it.
ensure_rootfs() {
  local marker="$CACHE/.rootfs-complete" mirror tmp
  if [ -f "$marker" ]; then ensure_node_tools; return 0; fi
  command -v debootstrap >/dev/null || apt_install debootstrap
  mirror=$(debian_mirror)
  tmp="$CACHE/root.partial"
  rm -rf "$tmp"; mkdir -p "$CACHE"
  log "debootstrap $SUITE into $ROOTFS (once; cached)"
  debootstrap --variant=minbase \
    --include=slurm-wlm,slurmrestd,munge,slurm-wlm-jwt-plugin,$NODE_TOOLS \
    "$SUITE" "$tmp" "$mirror" >"$CACHE/debootstrap.log" 2>&1 || {
      log "debootstrap failed; last lines of $CACHE/debootstrap.log:"; tail -20 "$CACHE/debootstrap.log" >&2
      return 1; }
  rm -rf "$ROOTFS"; mv "$tmp" "$ROOTFS"
  # Daemons inside must not be started by package scripts; we start them ourselves.
  chroot "$ROOTFS" dpkg-query -W -f='${Version}\n' slurm-wlm >"$CACHE/slurm-package-version"
  touch "$marker" "$CACHE/.node-tools-$NODE_TOOLS"
}

# What a training job finds on a site's GPU nodes besides Slurm: Python (the recovery tests'
# jobs report their checkpoints with it, docs/recovery.md).
NODE_TOOLS=python3

# A chroot cached before NODE_TOOLS grew gets them added in place (once).
ensure_node_tools() {
  local marker="$CACHE/.node-tools-$NODE_TOOLS"
  [ -f "$marker" ] && return 0
  log "adding $NODE_TOOLS to the cached chroot $ROOTFS"
  cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf" 2>/dev/null || true
  chroot "$ROOTFS" env DEBIAN_FRONTEND=noninteractive sh -c \
    "apt-get -o Acquire::Check-Valid-Until=false update -q >/dev/null 2>&1 &&
     apt-get install -y -q --no-install-recommends ${NODE_TOOLS//,/ } >/dev/null 2>&1" || {
      log "could not add $NODE_TOOLS to $ROOTFS"; return 1; }
  touch "$marker"
}

apt_install() {
  local missing=() p
  for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null; }
}
