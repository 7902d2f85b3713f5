#!/usr/bin/env bash
# Start every real system the test suite needs, on loopback. Idempotent.
# Caches (downloaded distributions, built binaries, chroots) live in $ISTHMUS_CACHE,
# outside the repository; runtime state in .stack/.
#
# The parts run in chains side by side: on a new machine most of the time goes to
# downloads and builds that do not depend on each other (Kubernetes from the Go module
# proxy, Slurm 25.11 from source, the Debian chroots, Keycloak), and one after the other
# they waited on the network and on each other. A part that needs another waits for it
# (kube-node for kube and images). Each part logs to .stack/parts/<part>.log, prints one
# line when done, and the script fails, naming the part and the tail of its log, if any
# part failed. apt-get runs one at a time through stack/tools/apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."
export ISTHMUS_CACHE=${ISTHMUS_CACHE:-/var/cache/isthmus}
export PATH="$PWD/stack/tools:$PATH"
mkdir -p .stack/parts "$ISTHMUS_CACHE"
t0=$SECONDS
PARTS=" ${ISTHMUS_STACK_PARTS:-oidc slurm-22.05 slurm-24.11 slurm-25.11 slurm-26.05 kube prometheus images kube-node} "
wanted() { [[ $PARTS == *" $1 "* ]]; }

part() {  # part NAME: run it once, log to .stack/parts/NAME.log, record its outcome
  local name=$1 s=$SECONDS rc=0 log=.stack/parts/$1.log
  wanted "$name" || return 0
  rm -f ".stack/parts/$name.ok" ".stack/parts/$name.failed"
  case $name in
    prometheus) bash stack/prometheus.sh ;;
    images) bash stack/images.sh ;;  # podman images for docker-compose.yml (tests/deploy)
    oidc) bash stack/oidc/up.sh ;;
    slurm-*) bash stack/slurm/up.sh "${name#slurm-}" ;;
    # Helm (tests/deploy) is built in this chain, cached: cold, it runs while the Slurm
    # builds (the longer chain) still do, instead of inside the test run.
    kube) bash stack/kube/up.sh && bash stack/kube/helm.sh ;;
    kube-node) bash stack/kube/node.sh ;;
  esac >"$log" 2>&1 </dev/null || rc=$?
  if [ "$rc" = 0 ]; then
    touch ".stack/parts/$name.ok"; echo "== stack: $name up in $((SECONDS - s)) s"
  else
    echo "$rc" > ".stack/parts/$name.failed"; echo "== stack: $name FAILED (exit $rc) after $((SECONDS - s)) s"
  fi
  return "$rc"
}
after() {  # after PART...: wait until each wanted part has an outcome; fail if one failed
  local p
  for p in "$@"; do
    wanted "$p" || continue
    while [ ! -e ".stack/parts/$p.ok" ] && [ ! -e ".stack/parts/$p.failed" ]; do sleep 2; done
    [ -e ".stack/parts/$p.ok" ] || { echo "== stack: a part waited for $p, which failed"; return 1; }
  done
}

echo "== stack: postgres"
bash stack/postgres.sh up
rm -f .stack/parts/*.ok .stack/parts/*.failed
# The chains. Each is a sequence; the chains run at once. The two long builds (Kubernetes
# and Slurm 25.11 + pyslurm) each get a chain of their own; the rest share one.
# A failed part does not stop the rest of its chain (|| true): images must always get an
# outcome, or kube-node would wait for it forever.
( part kube && after images && part kube-node ) &
( part slurm-25.11 ) &
( part oidc ) &
( for p in slurm-22.05 slurm-24.11 slurm-26.05 prometheus images; do part "$p" || true; done ) &
wait || true
failed=0
for p in $PARTS; do
  if [ ! -e ".stack/parts/$p.ok" ]; then
    failed=1
    echo "== stack: part $p did not come up; the end of .stack/parts/$p.log:"
    tail -n 30 ".stack/parts/$p.log" 2>/dev/null | sed 's/^/   | /'
  fi
done
# The pools file (ISTHMUS_POOLS_FILE) for the systems that are up: five pools on the full stack.
python3 stack/pools.py .stack > .stack/pools.yaml.tmp && mv .stack/pools.yaml.tmp .stack/pools.yaml
[ "$failed" = 0 ] || { echo "== stack: failed after $((SECONDS - t0)) s"; exit 1; }
echo "== stack: all up in $((SECONDS - t0)) s"
