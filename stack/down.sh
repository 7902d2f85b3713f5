#!/usr/bin/env bash
# Stop everything stack/up.sh started (by PID).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f stack/kube/down.sh ] && bash stack/kube/down.sh
for v in 22.05 24.11 25.11 26.05; do [ -f stack/slurm/down.sh ] && bash stack/slurm/down.sh "$v"; done
[ -f stack/oidc/down.sh ] && bash stack/oidc/down.sh
bash stack/postgres.sh down
exit 0
