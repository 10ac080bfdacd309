# condattn — set-up, tests, and one target per paper table.
#   make install                          create .venv and install condattn with its dev extras
#   make test                             ruff + the test suite (CPU, offline, < 10 min on 2 cores)
#   make reproduce-table-4 SCALE=smoke    train every cell of table 4 and write results/smoke/table4_lra.md
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SCALE ?= smoke
SEEDS ?=
LAUNCHER ?= local
ARGS ?=
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export WANDB_SILENT ?= true

.PHONY: install test lint test-fast diagnose bench clean

install:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	# torch/torchvision first, pinned to the releases on this project's machines (see pyproject.toml)
	$(BIN)/python -m pip install torch==2.14.1 torchvision==0.29.1
	$(BIN)/python -m pip install -e ".[dev]"

lint:
	$(BIN)/ruff check condattn tests scripts

test: lint
	$(BIN)/python -m pytest -q

test-fast:
	$(BIN)/python -m pytest -q -m "not slow"

# forward+backward step time of baseline / SCA / CET-svd / CET-fast per model, side by side (results/bench/)
bench:
	$(BIN)/python -m condattn.bench $(ARGS)

# python -m condattn.diagnose prints κ / entropy per layer, baseline beside conditioned.
diagnose:
	$(BIN)/python -m condattn.diagnose $(ARGS)

reproduce-table-%:
	$(BIN)/python -m condattn.reproduce $(firstword $(wildcard experiments/table$*_*.yaml) experiments/table$*.yaml) \
		--scale $(SCALE) --launcher $(LAUNCHER) $(if $(SEEDS),--seeds "$(SEEDS)") $(if $(FORCE),--force) $(ARGS)

report-table-%:
	$(BIN)/python -m condattn.reproduce $(firstword $(wildcard experiments/table$*_*.yaml) experiments/table$*.yaml) \
		--scale $(SCALE) --report-only $(if $(SEEDS),--seeds "$(SEEDS)")

clean:
	rm -rf runs outputs multirun wandb .pytest_cache .ruff_cache
