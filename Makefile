# effect-ledger. `make demo` runs the main job (no broker needed); `make test` runs every test tier
# against a real Kafka broker that it starts and stops itself.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DBOS_VENV := .venv-dbos
OPENAI_AGENTS_VENV := .venv-openai-agents
PYDANTIC_AI_VENV := .venv-pydantic-ai
CREWAI_VENV := .venv-crewai
AGENT_FRAMEWORK_VENV := .venv-agent-framework
KAFKA_PORT ?= 9092
export KAFKA_PORT
PYTEST_ARGS ?=

.PHONY: help venv venv-dbos venv-openai-agents venv-pydantic-ai venv-crewai venv-agent-framework test-agent-trials demo demo-kafka sim test test-unit test-integration test-secure test-cluster test-crash test-faults test-browser bench chaos soak lint schemas-check wheel kafka-fetch kafka-up kafka-down kafka-status clean

help:
	@echo "make demo               the refund story: a crash after the call, no double refund (no broker)"
	@echo "make demo-kafka         the same story through Kafka, the ledger processor and the reconcilers"
	@echo "make test               every test tier; starts and stops its own Kafka broker"
	@echo "make test-unit          unit tests only (no services)"
	@echo "make test-integration   integration tests (real Kafka)"
	@echo "make test-secure        every role on the secured broker (TLS, SCRAM, ACLs)"
	@echo "make test-cluster       a replicated cluster of three brokers: replication, a broker killed"
	@echo "make test-crash         crash suite (kills real child processes)"
	@echo "make test-faults        fault suite: one test per defect found by hostile probes"
	@echo "make test-browser       the web console in headless chromium (installs chromium when missing)"
	@echo "make test-agent-trials  each agent framework's crash trials (OpenAI Agents SDK, Pydantic AI, CrewAI, Agent"
	@echo "                        Framework), 20 with and 20 without the ledger"
	@echo "make bench              benchmarks: prints a table, writes bench-results.json"
	@echo "make sim                the protocol simulator: seeds for 60 s on every core (SIM_ARGS=--help)"
	@echo "make soak               10 minutes at 500 effects/s: two agent hosts, two workers, a reconciler, a worker"
	@echo "                        kill -9 and a broker restart; report + plot in soak-report/ (SOAK_ARGS=--help)"
	@echo "make chaos              kills, pauses, partitions and clock skews on a 3-broker cluster in network"
	@echo "                        namespaces, 30 minutes and 10 of each kind (~45 min); report + plot in"
	@echo "                        docs/chaos/ (CHAOS_ARGS=--help)"
	@echo "make lint               ruff, mypy and the walls between the rooms (import-linter)"
	@echo "make docs               the documentation site into site/ (mkdocs build --strict: a broken link fails)"
	@echo "make schemas-check      schema compatibility across schemas/history, with Apache Avro's Java checker"
	@echo "make wheel              build dist/effect_ledger_kafka-*.whl (what pip and the Dockerfile install)"
	@echo "make kafka-up / kafka-down / kafka-status   the repo's own broker on 127.0.0.1:\$$KAFKA_PORT"

# The virtualenv is rebuilt when pyproject.toml or constraints.txt changes.
$(VENV)/.installed: pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "effect-ledger needs Python 3.11+ (found %s)" % sys.version.split()[0])'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	@$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[kafka,processor,metrics,otel,mcp,langgraph,postgres,erasure,bench,docs,assess,assess-test,dev]"
	@touch $@

venv: $(VENV)/.installed

# DBOS needs croniter>=6.2.4 and faust's mode-streaming pins croniter<6, so the DBOS integration's
# tests get an environment of their own: the base install with [dbos] and [dev].
$(DBOS_VENV)/.installed: pyproject.toml
	@test -x $(DBOS_VENV)/bin/python || $(PYTHON) -m venv $(DBOS_VENV)
	@$(DBOS_VENV)/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
	@$(DBOS_VENV)/bin/python -m pip install -q --disable-pip-version-check -e ".[dbos,dev]"
	@touch $@

venv-dbos: $(DBOS_VENV)/.installed

# Each agent framework is an extra of its own, tested in its own environment (the base install, the
# extra and [dev]), so that each one shows it needs none of the others.
$(OPENAI_AGENTS_VENV)/.installed: pyproject.toml
	@test -x $(OPENAI_AGENTS_VENV)/bin/python || $(PYTHON) -m venv $(OPENAI_AGENTS_VENV)
	@$(OPENAI_AGENTS_VENV)/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
	@$(OPENAI_AGENTS_VENV)/bin/python -m pip install -q --disable-pip-version-check -e ".[openai-agents,dev]"
	@touch $@

venv-openai-agents: $(OPENAI_AGENTS_VENV)/.installed

$(PYDANTIC_AI_VENV)/.installed: pyproject.toml
	@test -x $(PYDANTIC_AI_VENV)/bin/python || $(PYTHON) -m venv $(PYDANTIC_AI_VENV)
	@$(PYDANTIC_AI_VENV)/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
	@$(PYDANTIC_AI_VENV)/bin/python -m pip install -q --disable-pip-version-check -e ".[pydantic-ai,dev]"
	@touch $@

venv-pydantic-ai: $(PYDANTIC_AI_VENV)/.installed
# CrewAI and Microsoft Agent Framework: an environment each (the base install with the extra and [dev]),
# so that each adapter is tested with only its own framework installed.
$(CREWAI_VENV)/.installed: pyproject.toml
	@test -x $(CREWAI_VENV)/bin/python || $(PYTHON) -m venv $(CREWAI_VENV)
	@$(CREWAI_VENV)/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
	@$(CREWAI_VENV)/bin/python -m pip install -q --disable-pip-version-check -e ".[crewai,dev]"
	@touch $@

venv-crewai: $(CREWAI_VENV)/.installed

$(AGENT_FRAMEWORK_VENV)/.installed: pyproject.toml
	@test -x $(AGENT_FRAMEWORK_VENV)/bin/python || $(PYTHON) -m venv $(AGENT_FRAMEWORK_VENV)
	@$(AGENT_FRAMEWORK_VENV)/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
	@$(AGENT_FRAMEWORK_VENV)/bin/python -m pip install -q --disable-pip-version-check -e ".[agent-framework,dev]"
	@touch $@

venv-agent-framework: $(AGENT_FRAMEWORK_VENV)/.installed

demo: venv
	@$(VENV)/bin/effects demo

# The documentation site (mkdocs.yml, docs/); the command-line reference is generated from the click
# commands during the build (docs/hooks/cli_reference.py). tests/unit/test_docs_site.py runs the same.
.PHONY: docs
docs: venv
	@NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# KEEP=1 leaves the broker and the demo's topics up (effects demo --kafka --keep) for effects tail and replays.
demo-kafka: venv
	@KAFKA_KEEP=$(KEEP) bash scripts/with-kafka.sh $(VENV)/bin/effects demo --kafka $(if $(filter 1,$(KEEP)),--keep)

test: venv venv-dbos venv-openai-agents venv-pydantic-ai venv-crewai venv-agent-framework
	@bash scripts/install-postgres.sh
	@bash scripts/install-browser.sh
	@bash scripts/install-faketime.sh
	@bash scripts/install-openssl.sh
	@bash scripts/install-nftables.sh
	@bash scripts/install-mailserver.sh
	@bash scripts/with-kafka.sh $(PY) -m pytest $(PYTEST_ARGS)
	@$(DBOS_VENV)/bin/python -m pytest tests/integrations/dbos
	@$(OPENAI_AGENTS_VENV)/bin/python -m pytest tests/integrations/openai_agents
	@$(PYDANTIC_AI_VENV)/bin/python -m pytest tests/integrations/pydantic_ai
	@$(CREWAI_VENV)/bin/python -m pytest tests/integrations/crewai
	@$(AGENT_FRAMEWORK_VENV)/bin/python -m pytest tests/integrations/agent_framework

# Issue 38's proof at full length: each agent framework's crash scenario 20 times with the ledger and
# 20 times with a plain tool; one line per framework and way (`make test` runs 3 of each).
test-agent-trials: venv-openai-agents venv-pydantic-ai venv-crewai venv-agent-framework
	@EFFECT_LEDGER_TRIALS=20 $(OPENAI_AGENTS_VENV)/bin/python -m pytest -q -s tests/integrations/openai_agents -k trials
	@EFFECT_LEDGER_TRIALS=20 $(PYDANTIC_AI_VENV)/bin/python -m pytest -q -s tests/integrations/pydantic_ai -k trials
	@EFFECT_LEDGER_TRIALS=20 $(CREWAI_VENV)/bin/python -m pytest -s --timeout=1800 -k adapter tests/integrations/crewai/test_crewai_crash.py
	@EFFECT_LEDGER_TRIALS=20 $(AGENT_FRAMEWORK_VENV)/bin/python -m pytest -s --timeout=1800 -k adapter tests/integrations/agent_framework/test_agent_framework_crash.py

test-unit: venv
	@$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: venv
	@bash scripts/install-postgres.sh
	@bash scripts/install-mailserver.sh
	@bash scripts/with-kafka.sh $(PY) -m pytest tests/integration $(PYTEST_ARGS)

# A replicated cluster of three nodes on loopback (scripts/cluster.sh; started and stopped by the tests).
test-cluster: venv
	@$(PY) -m pytest tests/cluster $(PYTEST_ARGS)

# The roles on the secured broker (KAFKA_SECURE=1 scripts/kafka.sh; started and stopped by the tests).
test-secure: venv
	@bash scripts/install-openssl.sh
	@$(PY) -m pytest tests/secure $(PYTEST_ARGS)

test-crash: venv
	@bash scripts/install-postgres.sh
	@bash scripts/install-mailserver.sh
	@$(PY) -m pytest tests/crash $(PYTEST_ARGS)

test-faults: venv
	@bash scripts/install-faketime.sh
	@bash scripts/install-postgres.sh
	@bash scripts/install-mailserver.sh
	@bash scripts/with-kafka.sh $(PY) -m pytest tests/faults $(PYTEST_ARGS)

# The console's browser test: Debian's chromium and chromium-driver, installed when missing (as root).
test-browser: venv
	@bash scripts/install-browser.sh
	@$(PY) -m pytest tests/browser $(PYTEST_ARGS)

bench: venv
	@bash scripts/with-kafka.sh $(PY) -m tests.bench $(BENCH_ARGS)

# The deterministic simulator of the protocol on the real pure core (tests/sim); a short fixed-seed
# run is part of `make test` (tests/unit/test_sim.py).
sim: venv
	@$(PY) -m tests.sim $(SIM_ARGS)

# The replicated cluster in network namespaces under a nemesis, 30 minutes and until every fault kind
# has held 10 times (about 45 minutes; root: ip netns, nftables);
# the report and its plot go to docs/chaos/. The short form (every fault kind once) is in `make test`
# (tests/chaos/test_chaos_short.py). CHAOS_ARGS=--help lists the options (--seed replays a run).
CHAOS_ARGS ?= --minutes 30 --per-kind 10 --out docs/chaos
chaos: venv
	@bash scripts/install-faketime.sh
	@bash scripts/install-nftables.sh
	@bash scripts/kafka.sh fetch
	@$(PY) -m tests.chaos $(CHAOS_ARGS)

# Not part of `make test`: it restarts the repo's broker in the middle (scripts/kafka.sh down/up).
soak: venv
	@bash scripts/with-kafka.sh $(PY) -m tests.soak $(SOAK_ARGS)

# mypy reads the installed layout (effect_ledger.streams -> streams/, ...) from a tree of links,
# since it cannot see through the editable install's import hook.
lint: venv
	@$(VENV)/bin/ruff check effect_ledger schemas streams processors tests
	@rm -rf .typecheck && mkdir -p .typecheck/effect_ledger
	@for f in effect_ledger/*; do ln -s "$(CURDIR)/$$f" .typecheck/effect_ledger/; done
	@for d in schemas streams processors; do ln -s "$(CURDIR)/$$d" .typecheck/effect_ledger/$$d; done
	@$(VENV)/bin/mypy
	@bash scripts/lint-imports.sh

# schemas/COMPATIBILITY.md, checked with the official Avro Java library (fetched from Maven Central).
schemas-check: venv
	@bash scripts/schemas-check.sh

# The wheel users install (tests/unit/test_wheel.py builds the same one and tries it in a fresh venv).
wheel: venv
	@rm -rf dist && $(PY) -m pip wheel -q --disable-pip-version-check --no-deps -w dist .
	@ls dist/*.whl

kafka-fetch:
	@bash scripts/kafka.sh fetch

kafka-up: venv
	@bash scripts/kafka.sh up

kafka-down:
	@bash scripts/kafka.sh down

kafka-status:
	@bash scripts/kafka.sh status

clean:
	@bash scripts/kafka.sh down >/dev/null 2>&1 || true
	rm -rf .kafka .pytest_cache .mypy_cache .ruff_cache .typecheck build dist *.egg-info bench-results.json soak-report
