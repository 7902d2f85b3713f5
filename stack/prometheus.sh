#!/usr/bin/env bash
# Install Debian's Prometheus server for the metrics tests (idempotent). No daemon is
# started here: each test starts its own server on a free loopback port with a throw-away
# TSDB in its temporary directory, scraping the gateway it started (tests/ops).
set -euo pipefail
if ! command -v prometheus >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q prometheus >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q prometheus >/dev/null; }
fi
# Debian's package may have started its own instance on :9090; the tests never use it.
prometheus --version 2>&1 | sed -n 1p
