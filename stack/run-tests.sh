#!/usr/bin/env bash
# Run the whole test suite in lanes: ISTHMUS_TEST_LANES pytest-xdist workers (default 4; 1
# runs it in this process), grouped and kept off each other's clusters by tests/lanes.py.
# Most tests wait on clusters, not on the CPU, so four lanes on two cores finish in about a
# third of the serial time (docs/testing.md, "Lanes"). Arguments go to pytest.
# pytest's exit code 5 (no tests collected) is a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
export ISTHMUS_REQUIRE_STACK=${ISTHMUS_REQUIRE_STACK:-1}
lanes=${ISTHMUS_TEST_LANES:-4}
args=()
[ "$lanes" -gt 1 ] && args=(-n "$lanes" --dist loadgroup)
# A whole run (no arguments) writes its per-suite report into docs/testing.md and each test's
# time into tests/lanes-durations.json (tests/lanes.py); a partial run writes nothing.
[ $# -eq 0 ] && export ISTHMUS_TEST_REPORT=${ISTHMUS_TEST_REPORT:-1}
.venv/bin/pytest -p no:cacheprovider "${args[@]}" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
