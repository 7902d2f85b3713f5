# Isthmus: the two commands a newcomer needs are `make run` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: run run-slurm run-kube test unit install stack stack-down openapi bench lint clean

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { apt-get update -qq && apt-get install -y -qq python3 python3-venv; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

## run: the gateway on the embedded default (SQLite, dev issuer) at http://127.0.0.1:8080
run: install
	ISTHMUS_DEV_MODE=true $(BIN)/isthmus serve --dev --host 127.0.0.1 --port $${PORT:-8080}

## run-slurm: the same, with the local Slurm 22.05 test cluster as its backend (jobs run)
run-slurm: install
	bash stack/slurm/up.sh 22.05
	ISTHMUS_DEV_MODE=true ISTHMUS_BACKENDS="$$($(BIN)/python stack/backends_json.py slurm-22.05)" \
	  $(BIN)/isthmus serve --dev --host 127.0.0.1 --port $${PORT:-8080}

## run-kube: the same, with the local Kubernetes + Kueue control plane's real node as its
## backend (kubelet + containerd: real containers; stack/kube/node.sh)
run-kube: install
	bash stack/kube/up.sh
	bash stack/kube/node.sh
	ISTHMUS_DEV_MODE=true ISTHMUS_BACKENDS="$$($(BIN)/python stack/backends_json.py kube-node)" \
	  $(BIN)/isthmus serve --dev --host 127.0.0.1 --port $${PORT:-8080}

## stack: every real system the tests use, on loopback (idempotent)
stack: install
	bash stack/up.sh

stack-down:
	bash stack/down.sh

## test: start the whole test stack, then run every test (SQLite and Postgres)
test: install stack
	ISTHMUS_REQUIRE_STACK=1 bash stack/run-tests.sh $(PYTEST_ARGS)

## unit: the pure decision core's tests (tests/unit: no database, no cluster, no app; seconds)
unit: install
	$(BIN)/pytest -p no:cacheprovider -q tests/unit

## lint: ruff over every Python file (rules and reasons: pyproject.toml, docs/testing.md)
lint: install
	$(BIN)/ruff check .

openapi: install
	$(BIN)/isthmus openapi -o docs/openapi.json

bench: install stack
	bash bench/run.sh

clean:
	rm -rf $(VENV) .stack .pytest_cache .hypothesis isthmus.db .isthmus
