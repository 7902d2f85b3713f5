#!/usr/bin/env bash
# Install the pinned client generators once, into ${ISTHMUS_CACHE:-/var/cache/isthmus}/clients.
#
#   bash tests/clients/tools.sh      # idempotent; a warm run only checks the stamps
#
# - TypeScript: @hey-api/openapi-ts with a TypeScript it supports (TypeScript 7.x crashes
#   it; 0.96+ needs Node 22, Debian 12 has Node 20), installed by npm into the cache.
# - Go: openapi-generator-cli from Maven Central by `mvn dependency:copy` (as stack/oidc
#   fetches Keycloak). The Go module cache used to build the generated client lives under
#   the cache too (GOPATH, GOMODCACHE, GOCACHE; modules come through GOPROXY's default).
# Prints KEY=VALUE lines (also written to $CACHE/tools.env) that tests/clients reads.
set -euo pipefail
OPENAPI_TS_VERSION=${ISTHMUS_OPENAPI_TS_VERSION:-0.95.0}
TYPESCRIPT_VERSION=${ISTHMUS_TYPESCRIPT_VERSION:-5.9.3}
NODE_TYPES_VERSION=${ISTHMUS_NODE_TYPES_VERSION:-20.19.43}
OPENAPI_GENERATOR_VERSION=${ISTHMUS_OPENAPI_GENERATOR_VERSION:-7.25.0}
CACHE=${ISTHMUS_CACHE:-/var/cache/isthmus}/clients
mkdir -p "$CACHE"
log() { echo "[clients] $*" >&2; }

need=()
command -v npm >/dev/null || need+=(npm)
command -v mvn >/dev/null || need+=(maven)
command -v go >/dev/null || need+=(golang-go)
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { log "missing ${need[*]}; run as root to install them"; exit 1; }
  log "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# One installer at a time (pytest workers, CI and a developer may call this together).
exec 9>"$CACHE/.lock"
flock 9

NPM_DIR="$CACHE/npm-openapi-ts-$OPENAPI_TS_VERSION-ts-$TYPESCRIPT_VERSION-node-$NODE_TYPES_VERSION"
if [ ! -f "$NPM_DIR/.installed" ]; then
  log "npm: @hey-api/openapi-ts@$OPENAPI_TS_VERSION typescript@$TYPESCRIPT_VERSION @types/node@$NODE_TYPES_VERSION"
  rm -rf "$NPM_DIR.tmp"
  mkdir -p "$NPM_DIR.tmp"
  echo '{"name": "isthmus-client-tools", "private": true}' > "$NPM_DIR.tmp/package.json"
  (cd "$NPM_DIR.tmp" && npm install --silent --no-audit --no-fund --save-exact \
    "@hey-api/openapi-ts@$OPENAPI_TS_VERSION" "typescript@$TYPESCRIPT_VERSION" \
    "@types/node@$NODE_TYPES_VERSION") >&2
  touch "$NPM_DIR.tmp/.installed"
  rm -rf "$NPM_DIR"
  mv "$NPM_DIR.tmp" "$NPM_DIR"
fi

JAR="$CACHE/dl/openapi-generator-cli-$OPENAPI_GENERATOR_VERSION.jar"
if [ ! -s "$JAR" ]; then
  log "maven: org.openapitools:openapi-generator-cli:$OPENAPI_GENERATOR_VERSION"
  mkdir -p "$CACHE/dl"
  (cd "$CACHE" && mvn -q -B -Dstyle.color=never dependency:copy \
    -Dartifact="org.openapitools:openapi-generator-cli:$OPENAPI_GENERATOR_VERSION:jar" -DoutputDirectory="$CACHE/dl") >&2
fi

mkdir -p "$CACHE/go/path" "$CACHE/go/build"
cat > "$CACHE/tools.env.tmp" <<ENV
OPENAPI_TS=$NPM_DIR/node_modules/.bin/openapi-ts
TSC=$NPM_DIR/node_modules/.bin/tsc
NODE_MODULES=$NPM_DIR/node_modules
OPENAPI_GENERATOR_JAR=$JAR
GOPATH=$CACHE/go/path
GOMODCACHE=$CACHE/go/path/pkg/mod
GOCACHE=$CACHE/go/build
ENV
mv "$CACHE/tools.env.tmp" "$CACHE/tools.env"
cat "$CACHE/tools.env"
