#!/usr/bin/env bash
# The benchmark on a GPU machine in a few minutes: fp32 and bf16, results under results/bench/ with provenance,
# then the gpu-marked tests. Run from the repository root after `make install`.
set -euo pipefail
.venv/bin/python -m condattn.bench --precision fp32 --warmup 3 --iters 10
.venv/bin/python -m condattn.bench --precision bf16 --warmup 3 --iters 10
.venv/bin/python -m pytest -q -m gpu
