"""Model FLOPs of a training step, counted by `torch.utils.flop_counter.FlopCounterMode`, and the dense peak of
common accelerators, for model FLOPs utilisation (MFU = counted FLOPs per second / the device's peak).

What is counted: the matmuls and convolutions of one forward and backward pass (torch's flop counter formulas; a
multiply-add is 2 FLOPs), attention through SDPA included. The optimizer step and elementwise ops are not counted,
as in the usual MFU accounting (PaLM appendix B). ViT-B/16 at 224² counts 35.1 GFLOP forward (17.6 GMAC, the
figure of the DeiT and timm tables) and about 3× that for forward + backward (tests/test_flops.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

# Dense peak TFLOP/s per device (no structured sparsity), by matmul precision: bf16/fp16 on the tensor cores, fp32
# the plain FP32 rate (PyTorch's default fp32 matmul does not use TF32: torch.backends.cuda.matmul.allow_tf32 is
# False). From the vendors' data sheets (SXM parts unless named). Matched against torch.cuda.get_device_name(),
# first match wins, so the more specific names come first.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("B200", {"bf16": 2250.0, "fp16": 2250.0, "fp32": 80.0}),
    ("H200", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    ("H100 PCIe", {"bf16": 756.5, "fp16": 756.5, "fp32": 51.2}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    ("GH200", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.1, "fp16": 362.1, "fp32": 91.6}),
    ("L40", {"bf16": 181.0, "fp16": 181.0, "fp32": 90.5}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3}),
    ("A40", {"bf16": 149.7, "fp16": 149.7, "fp32": 37.4}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2}),
    ("RTX 4090", {"bf16": 165.2, "fp16": 165.2, "fp32": 82.6}),
    ("RTX 3090", {"bf16": 71.0, "fp16": 71.0, "fp32": 35.6}),  # tensor cores with fp32 accumulate (AMP)
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
]


def peak_flops(device_name: str, precision: str) -> float | None:
    """Dense peak FLOP/s of a device (e.g. 'NVIDIA H200') at a matmul precision (fp32 | bf16 | fp16; accelerate's
    'no' means fp32); None for an unknown device or a precision it has no tensor-core rate for (V100 bf16)."""
    precision = {"no": "fp32"}.get(precision, precision)
    name = device_name.upper()
    for key, peaks in PEAK_TFLOPS:
        if key.upper() in name:
            tf = peaks.get(precision)
            return None if tf is None else tf * 1e12
    return None


def known_gpus() -> list[str]:
    return [k for k, _ in PEAK_TFLOPS]


def _sdpa_cpu(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """CPU flash attention (the op SDPA dispatches to on CPU), which torch's counter has no formula for (the counter
    hands formulas the arguments' shapes)."""
    return sdpa_flop_count(query, key, value)


def _sdpa_cpu_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    """2× the forward, as the meta device's decomposed SDPA and the 6N convention count it (torch's formula for the
    CUDA flash backward also counts the recomputed QKᵀ: 2.5×, about 0.7% more for ViT-B/16 at 224²)."""
    return 2 * sdpa_flop_count(query, key, value)


def _custom_mapping() -> dict:
    ops = torch.ops.aten
    out = {}
    if hasattr(ops, "_scaled_dot_product_flash_attention_for_cpu"):
        out[ops._scaled_dot_product_flash_attention_for_cpu] = _sdpa_cpu
    if hasattr(ops, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        out[ops._scaled_dot_product_flash_attention_for_cpu_backward] = _sdpa_cpu_backward
    return out


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of everything `fn()` runs (forward and, if fn calls it, backward)."""
    with FlopCounterMode(display=False, custom_mapping=_custom_mapping()) as counter:
        fn()
    return int(counter.get_total_flops())


def training_step_flops(model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module], torch.Tensor]) -> int:
    """FLOPs of one forward + backward of `loss_fn(model)` (the gradients it leaves are cleared)."""

    def step():
        loss_fn(model).backward()

    try:
        return count_flops(step)
    finally:
        for p in model.parameters():
            p.grad = None


def mfu(flops_per_sample: float, samples_per_s: float, device_name: str, precision: str,
        devices: int = 1) -> float | None:
    """Model FLOPs utilisation in [0, 1] over `devices` devices; None where the peak is unknown (CPUs)."""
    peak = peak_flops(device_name, precision)
    if not peak or not flops_per_sample:
        return None
    return flops_per_sample * samples_per_s / (peak * devices)
