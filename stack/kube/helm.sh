#!/usr/bin/env bash
# Build (once) Helm v4 from the Go module proxy, for the chart in deploy/helm/isthmus and
# its tests (tests/deploy/test_helm_chart.py). Like the control plane's binaries
# (build.sh), it goes to the cache OUTSIDE the repository, keyed by version:
#   ${ISTHMUS_CACHE:-/var/cache/isthmus}/kube/helm-<version>/helm
# Idempotent: when that binary exists nothing is built. Prints the binary's path (only
# that, on stdout; the build's output goes to stderr and $CACHE/build.log).
set -euo pipefail

# The newest v4 release the module proxy served on 2026-12-07 (`go list -m -versions
# helm.sh/helm/v4`). Pinned, not "latest": a chart test must not change under us.
HELM_VERSION="${HELM_VERSION:-v4.3.2}"

CACHE="${ISTHMUS_CACHE:-/var/cache/isthmus}/kube"
BIN="$CACHE/helm-$HELM_VERSION/helm"
if [[ -x "$BIN" ]]; then echo "$BIN"; exit 0; fi

mkdir -p "$CACHE"
# One build per cache at a time (the test setup and a manual run may start together);
# the second waits, then finds the binary.
exec 9>"$CACHE/.helm-build.lock"
flock -w 1800 9 || { echo "another build holds $CACHE/.helm-build.lock" >&2; exit 1; }
if [[ -x "$BIN" ]]; then echo "$BIN"; exit 0; fi
command -v go >/dev/null || { echo "go toolchain not found" >&2; exit 1; }

{
  echo "=== helm.sh $(date -u +%FT%TZ) helm=$HELM_VERSION"
  t0=$(date +%s)
  export CGO_ENABLED=0
  export GOFLAGS="${GOFLAGS:--p=2} -buildvcs=false"
  export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
  tmp="$CACHE/helm-$HELM_VERSION.tmp"; rm -rf "$tmp"; mkdir -p "$tmp"
  # helm version reads these (upstream's Makefile sets the same with -X).
  ld="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
  GOBIN="$tmp" go install -trimpath -ldflags "$ld" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
  # Rename last, so a build killed half-way leaves no binary that looks finished.
  rm -rf "$CACHE/helm-$HELM_VERSION"; mv "$tmp" "$CACHE/helm-$HELM_VERSION"
  echo "$(date -u +%FT%TZ) go install helm $HELM_VERSION: $(( $(date +%s) - t0 ))s" >> "$CACHE/build-times.txt"
  "$BIN" version >&2
} 2>&1 | tee -a "$CACHE/build.log" >&2
[[ -x "$BIN" ]] || exit 1
echo "$BIN"
