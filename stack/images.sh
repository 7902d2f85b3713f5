#!/usr/bin/env bash
# Container images for docker-compose.yml, built locally (no registry is reachable here).
# Idempotent; a warm run only checks that each image exists with the expected inputs.
#   1. podman + runc + podman-compose from Debian (+ podman-compose 1.2.0 from PyPI), and /etc/containers/containers.conf with
#      runc and explicit ulimits (../shared/LOCAL-CONTAINERS.md: crun fails on cgroup v1
#      hybrid, rlimits cannot be raised).
#   2. localhost/isthmus-debian:bookworm: debootstrap --variant=minbase, mirror read from the
#      machine's apt sources at run time; rootfs tarball cached in $ISTHMUS_CACHE/images.
#      (`images.sh base` stops here: the real Kubernetes node's worker image, stack/kube/node.sh.)
#   3. localhost/isthmus-postgres:15: Debian's postgresql-15 on that base (stack/images/postgres).
#   4. localhost/isthmus:dev: the Dockerfile (multi-stage), tagged with a hash of its inputs.
#   `images.sh gateway-at <commit>`: instead of 3-4, the gateway image of that commit (its own
#      Dockerfile and source, from `git archive`), tagged localhost/isthmus:<7-hex commit>, built
#      once per commit (label isthmus.commit); the Helm upgrade test's previous release.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
CACHE=${ISTHMUS_CACHE:-/var/cache/isthmus}/images
mkdir -p "$CACHE"
t0=$SECONDS

if ! command -v podman >/dev/null || ! command -v podman-compose >/dev/null || ! command -v runc >/dev/null \
   || ! command -v debootstrap >/dev/null; then
  apt-get install -y -q podman runc podman-compose debootstrap >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q podman runc podman-compose debootstrap >/dev/null; }
fi
conf=/etc/containers/containers.conf
if ! grep -qs '^runtime = "runc"' "$conf"; then
  mkdir -p /etc/containers
  [ -f "$conf" ] && cp "$conf" "$conf.before-isthmus"
  cat > "$conf" <<'CONF'
# Written by isthmus stack/images.sh: crun cannot run on this kernel's cgroup v1 hybrid
# mode, and no runtime may raise rlimits here, so explicit lower limits are set.
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
CONF
fi

# podman-compose 1.0.3 (Debian 12) passes --net <project network> after network_mode: host
# and so cannot run the test's host-network override; 1.2.0 (PyPI) can. Kept in the cache.
PC=${ISTHMUS_CACHE:-/var/cache/isthmus}/podman-compose
if [ "$("$PC/bin/podman-compose" version 2>/dev/null | sed -n 's/^podman-compose version //p')" != 1.2.0 ]; then
  rm -rf "$PC" && python3 -m venv "$PC" && "$PC/bin/pip" install -q --no-cache-dir 'podman-compose==1.2.0'
fi

mirror() {  # the first Debian (non-security) mirror of the machine's apt sources
  local m
  m=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -n1 || true)
  [ -n "$m" ] || m=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
                     | awk '{for (i=2;i<=NF;i++) if ($i !~ /^\[/) {print $i; exit}}' | grep -v security | head -n1 || true)
  [ -n "$m" ] || { echo "no Debian mirror in the apt sources" >&2; exit 1; }
  echo "$m"
}

BASE=localhost/isthmus-debian:bookworm
if ! podman image exists "$BASE"; then
  tarball=$CACHE/debian-bookworm-minbase.tar
  if [ ! -s "$tarball" ]; then
    root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    debootstrap --variant=minbase bookworm "$root" "$(mirror)" >"$CACHE/debootstrap.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap.log" >&2; rm -rf "$root"; exit 1; }
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  podman import "$tarball" "$BASE" >/dev/null
fi
# `images.sh base`: only that base (the real Kubernetes node's worker image, stack/kube/node.sh).
if [ "${1:-}" = base ]; then echo "== images: $BASE ready in $((SECONDS - t0)) s"; exit 0; fi

# The gateway's Python dependencies as wheels, fetched on the host (whose pip is configured
# for this network) and mounted into the build, which then needs no index. Keyed on pyproject.
wheels() {  # wheels SOURCE-DIR: sets WHEELS to that source's wheel directory, filled once
  WHEELS=$CACHE/wheels-$(sha256sum "$1/pyproject.toml" | cut -c1-12)
  if [ ! -f "$WHEELS/.complete" ]; then
    local pip=.venv/bin/pip; [ -x "$pip" ] || pip="python3 -m pip"
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    $pip wheel -q -w "$WHEELS" 'setuptools>=68' wheel "$1" >/dev/null
    rm -f "$WHEELS"/isthmus-*.whl && touch "$WHEELS/.complete"
  fi
}

# `images.sh gateway-at <commit>`: that commit's gateway image. A commit missing from this clone
# (a shallow one) is an error naming the fix, never a silent fallback to the working tree.
if [ "${1:-}" = gateway-at ]; then
  commit=$(git rev-parse -q --verify "${2:?usage: images.sh gateway-at <commit>}^{commit}") \
    || { echo "commit $2 is not in this clone (shallow? run: git fetch --unshallow)" >&2; exit 2; }
  image=localhost/isthmus:${commit:0:7}
  if [ "$(podman image inspect --format '{{ index .Labels "isthmus.commit" }}' "$image" 2>/dev/null)" = "$commit" ]; then
    echo "== images: $image up to date"; exit 0
  fi
  src=$(mktemp -d "$CACHE/src-${commit:0:7}.XXXXXX")
  trap 'rm -rf "$src"' EXIT
  git archive "$commit" | tar -x -C "$src"
  wheels "$src"
  podman build -q --format docker --network host --volume "$WHEELS:/wheels:ro" --label "isthmus.commit=$commit" \
    -f "$src/Dockerfile" -t "$image" "$src" >/dev/null
  echo "== images: built $image from $commit in $((SECONDS - t0)) s"; exit 0
fi
wheels .

build() {  # build IMAGE CONTEXT [DOCKERFILE]: rebuilt only when its inputs changed
  local image=$1 context=$2 file=${3:-$2/Dockerfile} hash
  hash=$( (cat "$file"; cd "$context" && git ls-files -co --exclude-standard -- . 2>/dev/null \
           | grep -v -e '^tests/' -e '^docs/' -e '^bench/' -e '^stack/' -e '^\.' | sort | xargs -r sha256sum) | sha256sum | cut -c1-16)
  if [ "$(podman image inspect --format '{{ index .Labels "isthmus.inputs" }}' "$image" 2>/dev/null)" = "$hash" ]; then
    echo "== images: $image up to date ($hash)"; return
  fi
  # --format docker: the OCI format drops HEALTHCHECK.
  podman build -q --format docker --network host --volume "$WHEELS:/wheels:ro" --label "isthmus.inputs=$hash" \
    -f "$file" -t "$image" "$context" >/dev/null
  echo "== images: built $image ($hash)"
}
build localhost/isthmus-postgres:15 stack/images/postgres
build "${ISTHMUS_IMAGE:-localhost/isthmus:dev}" . Dockerfile
echo "== images: ready in $((SECONDS - t0)) s"
