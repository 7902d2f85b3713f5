#!/usr/bin/env bash
# Build (once) the local Kubernetes control plane used by the kubernetes backend tests:
# kube-apiserver, kube-controller-manager, kube-scheduler, the kubelet of the one real node
# (node.sh), the Kueue manager and kwok from
# the Go module proxy, plus etcd. Binaries go to a cache OUTSIDE the repo, keyed by
# component and version, so every clone on this machine reuses them:
#   ${ISTHMUS_CACHE:-/var/cache/isthmus}/kube/<component>-<version>/<binary>
# Idempotent: only missing binaries are built. Log: $CACHE/build.log (and stdout).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/versions.sh"

CACHE_ROOT="${ISTHMUS_CACHE:-/var/cache/isthmus}"
CACHE="$CACHE_ROOT/kube"
mkdir -p "$CACHE"
# One build at a time per cache: two clones (or a manual build beside stack/up.sh) would
# otherwise write the same binaries at once; the second waits, then finds them built.
exec 9>"$CACHE/.build.lock"
flock -w 3600 9 || { echo "another build holds $CACHE/.build.lock" >&2; exit 1; }
LOG="$CACHE/build.log"
exec > >(tee -a "$LOG") 2>&1
echo "=== build.sh $(date -u +%FT%TZ) k8s=$K8S_VERSION kueue=$KUEUE_VERSION kwok=$KWOK_VERSION"

export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:--p=2} -buildvcs=false -mod=mod"
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
command -v go >/dev/null || { echo "go toolchain not found" >&2; exit 1; }

bin_path() { echo "$CACHE/$1-$2/$1"; }   # component version -> binary path

# ------------------------------------------------------------------ Go binaries
declare -A PKG=(
  [kube-apiserver]="k8s.io/kubernetes/cmd/kube-apiserver"
  [kube-controller-manager]="k8s.io/kubernetes/cmd/kube-controller-manager"
  [kube-scheduler]="k8s.io/kubernetes/cmd/kube-scheduler"
  [kubelet]="k8s.io/kubernetes/cmd/kubelet"
  [kueue]="sigs.k8s.io/kueue/cmd/kueue"
)
declare -A VER=(
  [kube-apiserver]="$K8S_VERSION" [kube-controller-manager]="$K8S_VERSION"
  [kube-scheduler]="$K8S_VERSION" [kubelet]="$K8S_VERSION" [kueue]="$KUEUE_VERSION"
)
missing=()
for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kueue; do
  [[ -x "$(bin_path "$c" "${VER[$c]}")" ]] || missing+=("$c")
done

if ((${#missing[@]})); then
  echo "building: ${missing[*]}"
  # One wrapper module for every Go binary: they share k8s.io/* and compile it once.
  W="$CACHE/src/wrapper-$K8S_VERSION-kueue-$KUEUE_VERSION"
  mkdir -p "$W"
  if [[ ! -f "$W/.ready" ]]; then
    t_mod=$(date +%s)
    (
      cd "$W"
      rm -f go.mod go.sum
      go mod init isthmus.local/kubestack >/dev/null 2>&1
      go mod download -json "k8s.io/kubernetes@$K8S_VERSION" > kmod.json
      kdir=$(sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p' kmod.json)
      # k8s.io/kubernetes replaces every staging module with ./staging/...; point each at
      # the published module of the same minor instead (list taken from its go.mod).
      staging_ver="v0.${K8S_VERSION#v1.}"
      sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$kdir/go.mod" | while read -r m; do
        go mod edit -replace="$m=$m@$staging_ver"
      done
      go mod edit -require="k8s.io/kubernetes@$K8S_VERSION" \
                  -require="sigs.k8s.io/kueue@$KUEUE_VERSION"
      go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
             "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
             "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" \
             "k8s.io/kubernetes/cmd/kubelet@$K8S_VERSION" \
             "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
      touch .ready
    )
    echo "$(date -u +%FT%TZ) wrapper module generation + module downloads: $(( $(date +%s) - t_mod ))s" >> "$CACHE/build-times.txt"
  fi
  out="$CACHE/src/out"; rm -rf "$out"; mkdir -p "$out"
  pkgs=(); for c in "${missing[@]}"; do pkgs+=("${PKG[$c]}"); done
  ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  ld+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
  ld+=" -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
  t0=$(date +%s)
  rc=0; (cd "$W" && go build -trimpath -ldflags "$ld" -o "$out/" "${pkgs[@]}") || rc=$?
  took=$(( $(date +%s) - t0 ))
  echo "go build of ${missing[*]} took ${took}s"
  echo "$(date -u +%FT%TZ) go build (one invocation, -p=2): ${missing[*]}: ${took}s" >> "$CACHE/build-times.txt"
  # Keep every binary that did link, even when another one failed.
  for c in "${missing[@]}"; do
    [[ -x "$out/$c" ]] || continue
    d="$CACHE/$c-${VER[$c]}"; mkdir -p "$d"; mv "$out/$c" "$d/$c"
  done
  ((rc == 0)) || { echo "go build failed (rc=$rc); kept: $(ls "$CACHE" | tr '\n' ' ')"; exit "$rc"; }
fi

# kwok has no replace directives: build it from its own go.mod (its k8s.io/* minor
# differs from Kueue's, so it cannot share the wrapper module).
if [[ ! -x "$(bin_path kwok "$KWOK_VERSION")" ]]; then
  t0=$(date +%s)
  mkdir -p "$CACHE/kwok-$KWOK_VERSION"
  GOBIN="$CACHE/kwok-$KWOK_VERSION" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  echo "$(date -u +%FT%TZ) go install kwok $KWOK_VERSION: $(( $(date +%s) - t0 ))s" >> "$CACHE/build-times.txt"
fi

# ------------------------------------------------------------------------- etcd
etcd_bin=""
for d in "$CACHE"/etcd-*/; do [[ -x "$d/etcd" ]] && etcd_bin="$d/etcd"; done
if [[ -z "$etcd_bin" ]]; then
  t_etcd=$(date +%s)
  tmp=$(mktemp -d)
  # Read the machine's own Debian mirror (deb822 or one-line format) and ask it for the
  # Debian 13 suite in a private apt state dir, so the system's sources stay untouched.
  mirror=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1 || true)
  [[ -n "$mirror" ]] || mirror=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | grep -v security | head -1 || true)
  ok=0
  if [[ -n "$mirror" ]]; then
    mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
    echo "deb $mirror $ETCD_DEB_SUITE main" > "$tmp/sources.list"
    aptopts=(-o "Dir::Etc::SourceList=$tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null
             -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
    if apt-get "${aptopts[@]}" update -qq && (cd "$tmp" && apt-get "${aptopts[@]}" download etcd-server); then
      deb=$(ls "$tmp"/etcd-server_*.deb | head -1)
      v=$(dpkg-deb -f "$deb" Version | sed 's/[-+].*//')
      dpkg -x "$deb" "$tmp/x"
      mkdir -p "$CACHE/etcd-v$v"
      cp "$tmp/x/usr/bin/etcd" "$CACHE/etcd-v$v/etcd"
      etcd_bin="$CACHE/etcd-v$v/etcd"; ok=1
    fi
  fi
  if [[ $ok == 0 ]]; then
    echo "etcd .deb unavailable; building go.etcd.io/etcd/server/v3@$ETCD_GO_VERSION"
    E="$CACHE/src/etcd-$ETCD_GO_VERSION"; mkdir -p "$E"
    (cd "$E" && { [[ -f go.mod ]] || go mod init isthmus.local/etcd >/dev/null 2>&1; } \
      && go get "go.etcd.io/etcd/server/v3@$ETCD_GO_VERSION" \
      && mkdir -p "$CACHE/etcd-$ETCD_GO_VERSION" \
      && go build -trimpath -ldflags "-s -w" -o "$CACHE/etcd-$ETCD_GO_VERSION/etcd" go.etcd.io/etcd/server/v3)
    etcd_bin="$CACHE/etcd-$ETCD_GO_VERSION/etcd"
  fi
  rm -rf "$tmp"
  echo "$(date -u +%FT%TZ) etcd ($etcd_bin): $(( $(date +%s) - t_etcd ))s" >> "$CACHE/build-times.txt"
fi
"$etcd_bin" --version | sed -n 1p  # not head: with pipefail, etcd could die of SIGPIPE

# Kueue CRDs: copy them next to the binary so up.sh needs no Go module cache.
crd_dir="$CACHE/kueue-$KUEUE_VERSION/crd"
if [[ ! -d "$crd_dir" ]]; then
  kq=$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
  mkdir -p "$crd_dir.tmp" && cp "$kq"/config/components/crd/bases/*.yaml "$crd_dir.tmp/" && mv "$crd_dir.tmp" "$crd_dir"
fi

VER[kwok]="$KWOK_VERSION"
for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kueue kwok; do
  ls -la "$(bin_path "$c" "${VER[$c]}")"
done
echo "=== build.sh done $(date -u +%FT%TZ)"
