#!/usr/bin/env bash
# Build the load generators used by bench/bench_api.py (hey for closed loops, vegeta for
# constant-rate open loops; both from the Go module proxy) into the cache outside the
# repository. Idempotent. Prints hey's path (vegeta sits next to it).
set -euo pipefail
CACHE=${ISTHMUS_CACHE:-/var/cache/isthmus}
if [ ! -x "$CACHE/bin/hey" ]; then
  mkdir -p "$CACHE/bin"
  GOBIN="$CACHE/bin" go install github.com/rakyll/hey@v0.1.4
fi
if [ ! -x "$CACHE/bin/vegeta" ]; then
  mkdir -p "$CACHE/bin"
  GOBIN="$CACHE/bin" go install github.com/tsenart/vegeta/v12@v12.13.0
fi
echo "$CACHE/bin/hey"
