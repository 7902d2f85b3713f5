#!/usr/bin/env bash
# Run the whole test suite. pytest's exit code 5 (no tests collected) is a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
export ISTHMUS_REQUIRE_STACK=${ISTHMUS_REQUIRE_STACK:-1}
.venv/bin/pytest -p no:cacheprovider "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
