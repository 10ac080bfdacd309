#!/usr/bin/env bash
# The GPU check in one short window (< 8 min on one H200): writes results/bench/<host>_cuda_bf16.md with provenance:
#   - the zoo's baseline / SCA / CET-fast step-time ratios at bf16, eager and with torch.compile;
#   - ViT-B/16 training samples/s, FLOPs per sample and MFU at bf16;
#   - our trainer against a plain PyTorch loop (same model, data, precision);
#   - κ(J) of one full ViT-B attention head-0 Jacobian over all 197 tokens, and the time it takes;
#   - the gpu-marked tests.
# Run from the repository root after `make install`: bash scripts/gpu_check.sh  (PY=python to use another interpreter)
#
# bash scripts/gpu_check.sh --medium-claim [options]: instead, settle one claim at medium scale in one GPU session
# (table 1's ViT row, CET vs baseline on CIFAR-100 from $CONDATTN_DATA, 10 seeds per arm at B and 2B steps) into
# results/medium/claim_vit_cet.{md,json}; prints its plan and projected time first (DRY_RUN=1: the plan only, also on
# a CPU). Options: python -m condattn.medium_claim --help.
set -euo pipefail
PY=${PY:-.venv/bin/python}
test -x "$PY" || PY=python
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "gpu_check: $PY cannot import torch; run \`make install\` first (or PY=/path/to/python)" >&2
  exit 2
fi
if [[ "${1:-}" == "--medium-claim" ]]; then  # its own CUDA check (DRY_RUN=1 runs on a CPU)
  shift
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_SILENT=true
  exec "$PY" -m condattn.medium_claim "$@"
fi
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA device visible to torch (torch.cuda.is_available() is False); run it on a GPU node" >&2
  exit 2
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_SILENT=true
exec "$PY" scripts/gpu_check.py "$@"
