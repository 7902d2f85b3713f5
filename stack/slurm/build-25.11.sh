#!/usr/bin/env bash
# Build Slurm 25.11 from source (once; cached) and, optionally, pyslurm against it:
#   bash stack/slurm/build-25.11.sh                 # Slurm only
#   bash stack/slurm/build-25.11.sh --pyslurm VENV  # and pyslurm 25.11.x into VENV
# No Debian suite carries Slurm 25.11, and pyslurm's only current release line (25.11.x)
# builds only against it. The tarball comes from ISTHMUS_SLURM_SRC, else from the
# read-only ../shared/vendor beside the repository; it must match its checksum
# (<tarball>.sha256 beside it, or ISTHMUS_SLURM_SHA256) before anything is built.
# Installs under ${ISTHMUS_CACHE:-/var/cache/isthmus}/slurm-25.11/prefix; a marker that
# records the tarball's checksum makes a second run a no-op (a different tarball rebuilds).
# pyslurm is built once into a wheel cached beside the prefix (its setup links with an
# rpath to the prefix's lib/), so a fresh venv installs it in seconds.
set -euo pipefail
VER=25.11
PYSLURM_VERSION="${ISTHMUS_PYSLURM_VERSION:-25.11.2}"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
slurm_version_layout "$VER"
VENV=""
while [ $# -gt 0 ]; do
  case "$1" in
    --pyslurm) VENV="${2:?--pyslurm needs a virtualenv directory}"; shift 2 ;;
    *) log "unknown argument '$1'"; exit 2 ;;
  esac
done
PREFIX="$CACHE/prefix"
MARKER="$CACHE/.build-complete"
mkdir -p "$CACHE"
# Builds hold this lock; the "already built" checks below do not need it, so a running
# pyslurm build never blocks up.sh from (re)starting the cluster.
take_lock() {
  exec 8>"$CACHE/.build.lock"
  flock -w 3600 8 || { log "another build holds $CACHE/.build.lock"; exit 1; }
}
built() { [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$WANT" ] && [ -x "$PREFIX/sbin/slurmctld" ]; }

# ------------------------------------------------------------------ the tarball
find_source() {
  if [ -n "${ISTHMUS_SLURM_SRC:-}" ]; then echo "$ISTHMUS_SLURM_SRC"; return; fi
  local f
  for f in "$REPO_ROOT"/../shared/vendor/slurm-"$VER".*.tar.*; do
    case "$f" in *.sha256) continue ;; esac
    [ -f "$f" ] && { echo "$f"; return; }
  done
  log "no Slurm $VER tarball: set ISTHMUS_SLURM_SRC or put it in ../shared/vendor"
  return 1
}
if ! SRC=$(find_source 2>/dev/null) && [ -f "$MARKER" ] && [ -x "$PREFIX/sbin/slurmctld" ]; then
  # Built before from a verified tarball; no source needed to use the cache.
  log "Slurm $VER already built in $PREFIX (no source given; using the cache)"
  WANT=$(cat "$MARKER")
  SKIP_SOURCE=1
else
  SRC=$(find_source)
fi
if [ -z "${SKIP_SOURCE:-}" ]; then
[ -r "$SRC" ] || { log "cannot read $SRC"; exit 1; }
if [ -n "${ISTHMUS_SLURM_SHA256:-}" ]; then
  WANT="$ISTHMUS_SLURM_SHA256"
elif [ -r "$SRC.sha256" ]; then
  WANT=$(awk '{print $1; exit}' "$SRC.sha256")
else
  log "no checksum for $SRC: put it in $SRC.sha256 or ISTHMUS_SLURM_SHA256"; exit 1
fi
[[ "$WANT" =~ ^[0-9a-f]{64}$ ]] || { log "checksum for $SRC is not a sha256 hex digest"; exit 1; }
fi

# ------------------------------------------------------------------- Slurm build
if built || { take_lock; built; }; then
  log "Slurm $VER already built in $PREFIX"
else
  GOT=$(sha256sum "$SRC" | awk '{print $1}')
  [ "$GOT" = "$WANT" ] || { log "checksum mismatch for $SRC: got $GOT, want $WANT"; exit 1; }
  apt_install build-essential libmunge-dev libjson-c-dev libjwt-dev libhttp-parser-dev \
    libyaml-dev python3-dev pkg-config munge xz-utils bzip2
  start=$SECONDS
  rm -rf "$CACHE/src" "$PREFIX" "$MARKER"
  mkdir -p "$CACHE/src"
  tar -xf "$SRC" -C "$CACHE/src" --strip-components=1
  log "configure + make (a few minutes; log: $CACHE/build.log)"
  # No sysconfdir default is ever read: every daemon and client gets SLURM_CONF / -f.
  (cd "$CACHE/src" && nice -n 10 ./configure --prefix="$PREFIX" --sysconfdir="$PREFIX/etc" \
    --with-jwt --with-munge=/usr) >"$CACHE/build.log" 2>&1 || {
      log "configure failed; see $CACHE/build.log"; tail -20 "$CACHE/build.log" >&2; exit 1; }
  (cd "$CACHE/src" && nice -n 10 make -j"$(nproc)" && make install) >>"$CACHE/build.log" 2>&1 || {
    log "build failed; see $CACHE/build.log"; tail -30 "$CACHE/build.log" >&2; exit 1; }
  for p in auth_jwt rest_auth_jwt openapi_slurmctld; do
    [ -e "$PREFIX/lib/slurm/$p.so" ] || { log "missing plugin $p.so (a build dependency was absent)"; exit 1; }
  done
  rm -rf "$CACHE/src"
  echo "$WANT" >"$MARKER"
  echo "$((SECONDS - start))" >"$CACHE/build-seconds"
  log "built Slurm $VER into $PREFIX in $((SECONDS - start)) s"
fi

# ------------------------------------------------------------------ pyslurm wheel
[ -n "$VENV" ] || exit 0
PIP="$VENV/bin/pip"
[ -x "$PIP" ] || { log "no pip in $VENV"; exit 1; }
want_pyslurm() {
  "$VENV/bin/python" - "$PYSLURM_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if version("pyslurm") == sys.argv[1] else 1)
PY
}
WHEELS="$CACHE/wheels-$(cat "$MARKER" | cut -c1-12)"
if want_pyslurm; then
  log "pyslurm $PYSLURM_VERSION already in $VENV"; exit 0
fi
have_wheel() { ls "$WHEELS"/pyslurm-"$PYSLURM_VERSION"-*.whl >/dev/null 2>&1; }
if ! have_wheel && { take_lock; ! have_wheel; }; then
  log "building pyslurm $PYSLURM_VERSION against $PREFIX (a few minutes; log: $CACHE/pyslurm-build.log)"
  start=$SECONDS
  mkdir -p "$WHEELS"
  # pyslurm's setup links with an rpath to SLURM_LIB_DIR, so "import pyslurm" finds
  # libslurm without LD_LIBRARY_PATH as long as the prefix stays where it is.
  SLURM_INCLUDE_DIR="$PREFIX/include" SLURM_LIB_DIR="$PREFIX/lib" \
    PYSLURM_BUILD_JOBS="$(nproc)" nice -n 10 "$PIP" wheel --no-deps --no-binary pyslurm -w "$WHEELS" \
    "pyslurm==$PYSLURM_VERSION" >"$CACHE/pyslurm-build.log" 2>&1 || {
      log "pyslurm build failed; see $CACHE/pyslurm-build.log"; tail -30 "$CACHE/pyslurm-build.log" >&2; exit 1; }
  echo "$((SECONDS - start))" >"$CACHE/pyslurm-build-seconds"
  log "built pyslurm $PYSLURM_VERSION in $((SECONDS - start)) s"
fi
"$PIP" install -q --no-deps --no-index "$WHEELS"/pyslurm-"$PYSLURM_VERSION"-*.whl
log "pyslurm $PYSLURM_VERSION installed into $VENV"
