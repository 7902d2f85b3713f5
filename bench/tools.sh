#!/usr/bin/env bash
# Build the load generator used by bench/bench_api.py (hey, from the Go module proxy) into
# the cache outside the repository. Idempotent.
set -euo pipefail
CACHE=${ISTHMUS_CACHE:-/var/cache/isthmus}
if [ ! -x "$CACHE/bin/hey" ]; then
  mkdir -p "$CACHE/bin"
  GOBIN="$CACHE/bin" go install github.com/rakyll/hey@v0.1.4
fi
echo "$CACHE/bin/hey"
