#!/usr/bin/env bash
# Start every real system the test suite needs, on loopback. Idempotent.
# Caches (downloaded distributions, built binaries, chroots) live in $ISTHMUS_CACHE,
# outside the repository; runtime state in .stack/.
set -euo pipefail
cd "$(dirname "$0")/.."
export ISTHMUS_CACHE=${ISTHMUS_CACHE:-/var/cache/isthmus}
mkdir -p .stack "$ISTHMUS_CACHE"
t0=$SECONDS
step() { local s=$SECONDS; echo "== stack: $*"; "$@"; echo "== stack: $1 ${2:-} done in $((SECONDS - s)) s"; }
step bash stack/postgres.sh up
for part in ${ISTHMUS_STACK_PARTS:-oidc slurm-22.05 slurm-24.11 slurm-25.11 slurm-26.05 kube prometheus images kube-node}; do
  case $part in
    prometheus) step bash stack/prometheus.sh ;;
    images) step bash stack/images.sh ;;  # podman images for docker-compose.yml (tests/deploy)
    oidc) [ -f stack/oidc/up.sh ] && step bash stack/oidc/up.sh ;;
    slurm-*) [ -f stack/slurm/up.sh ] && step bash stack/slurm/up.sh "${part#slurm-}" ;;
    kube) [ -f stack/kube/up.sh ] && step bash stack/kube/up.sh ;;
    kube-node) [ -f stack/kube/node.sh ] && step bash stack/kube/node.sh ;;  # after kube and images
  esac
done
# The pools file (ISTHMUS_POOLS_FILE) for the systems that are up: five pools on the full stack.
python3 stack/pools.py .stack > .stack/pools.yaml.tmp && mv .stack/pools.yaml.tmp .stack/pools.yaml
echo "== stack: all up in $((SECONDS - t0)) s"
