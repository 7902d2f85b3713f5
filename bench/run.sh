#!/usr/bin/env bash
# `make bench`: run every benchmark with its default arguments; each one rewrites its own
# section of docs/benchmarks.md (between its <!-- bench:NAME:start/end --> markers).
# Needs the test stack (make stack) and the load tools (bench/tools.sh, cached).
# One benchmark's failure is reported and the others still run; the exit code is non-zero
# if any failed. BENCH_ONLY="api ledger" runs a subset.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
bash bench/tools.sh
failed=()
for script in bench/bench_*.py bench/simulate.py; do
  name=$(basename "$script" .py); name=${name#bench_}
  if [ -n "${BENCH_ONLY:-}" ] && [[ " $BENCH_ONLY " != *" $name "* ]]; then continue; fi
  # The before/after comparisons need the revision to compare with: BENCH_BEFORE=REV runs them.
  if [[ "$name" == *_ab ]]; then
    if [ -z "${BENCH_BEFORE:-}" ]; then echo "== bench: $name skipped (set BENCH_BEFORE=REV)"; continue; fi
    echo "== bench: $name (before: $BENCH_BEFORE)"
    "$PY" "$script" --before "$BENCH_BEFORE" || failed+=("$name")
    continue
  fi
  echo "== bench: $name"
  "$PY" "$script" || failed+=("$name")
done
if [ ${#failed[@]} -gt 0 ]; then echo "== bench: FAILED: ${failed[*]}"; exit 1; fi
echo "== bench: all done; see docs/benchmarks.md"
