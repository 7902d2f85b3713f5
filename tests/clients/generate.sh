#!/usr/bin/env bash
# Generate, from docs/openapi.json, the TypeScript and Go clients and build their smoke
# programs in strict mode, as a user would (the commands are the ones in docs/clients.md).
#
#   bash tests/clients/generate.sh OUT_DIR [SPEC]
#
# OUT_DIR/ts: @hey-api/openapi-ts client in gen/, `tsc --strict` output in dist/smoke.js
# OUT_DIR/go: openapi-generator `-g go` client in isthmus/, `go vet` clean, binary ./smoke
# The spec must also pass `openapi-generator validate`, and generation must print no
# warning (e.g. "Failed to get the schema name") beyond the 3.1 beta notice.
# The two pipelines run in parallel; a failure prints its log and exits non-zero.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${1:?usage: generate.sh OUT_DIR [SPEC]}
SPEC=$(realpath "${2:-$REPO/docs/openapi.json}")
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
# shellcheck disable=SC1090
source <(bash "$HERE/tools.sh")
export GOPATH GOMODCACHE GOCACHE GOTOOLCHAIN=local GOFLAGS=-mod=mod

typescript() {
  rm -rf "$OUT/ts" && mkdir -p "$OUT/ts" && cd "$OUT/ts"
  cp "$HERE/ts/smoke.ts" "$HERE/ts/tsconfig.json" .
  ln -s "$NODE_MODULES" node_modules
  "$OPENAPI_TS" --input "$SPEC" --output gen
  "$TSC" --project tsconfig.json --strict
}

golang() {
  rm -rf "$OUT/go" && mkdir -p "$OUT/go" && cd "$OUT/go"
  java -jar "$OPENAPI_GENERATOR_JAR" validate --input-spec "$SPEC"
  java -jar "$OPENAPI_GENERATOR_JAR" generate --generator-name go --input-spec "$SPEC" --output isthmus \
    --package-name isthmus --git-host isthmus.invalid --git-user-id smoke --git-repo-id isthmus \
    --additional-properties enumClassPrefix=true \
    --global-property apiTests=false,modelTests=false,apiDocs=false,modelDocs=false > generate.log 2>&1 \
    || { cat generate.log; return 1; }
  if grep -E '\b(WARN|ERROR)\b' generate.log | grep -v 'OpenAPI 3.1 support is still in beta'; then
    echo "openapi-generator warned about the spec (above)"; return 1
  fi
  cp "$HERE/go/main.go" .
  cat > go.mod <<MOD
module isthmus.invalid/smoke

go 1.23

require isthmus.invalid/smoke/isthmus v0.0.0

replace isthmus.invalid/smoke/isthmus => ./isthmus
MOD
  go vet ./...
  go build -o smoke .
}

typescript > "$OUT/ts.log" 2>&1 &
ts_pid=$!
golang > "$OUT/go.log" 2>&1 &
go_pid=$!
rc=0
wait "$ts_pid" || { echo "== TypeScript client failed:"; cat "$OUT/ts.log"; rc=1; }
wait "$go_pid" || { echo "== Go client failed:"; cat "$OUT/go.log"; rc=1; }
[ "$rc" = 0 ] && echo "clients generated and built in $OUT"
exit "$rc"
