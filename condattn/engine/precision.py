"""How a run executes on its device: mixed precision, torch.compile and the fused AdamW kernel.

A recipe states `impl.precision` (accelerate's mixed_precision: "no" | bf16 | fp16) and `impl.compile` for CUDA,
where the official codes trained with AMP. On a CPU the run uses `impl.cpu_precision` and `impl.cpu_compile`
instead (both off by default), so the tests and the smoke and small scales stay fp32 and uncompiled whatever the
recipe says for GPUs. `impl.fused_adamw` (auto | true | false): auto uses torch's fused AdamW kernel on CUDA and the
default implementation elsewhere. None of these changes what is computed beyond the rounding of mixed precision.
What was used goes into summary.json under `execution`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..utils.typed_config import impl_config

PRECISIONS = ("no", "bf16", "fp16")
FUSED_CHOICES = ("auto", "true", "false")


@dataclass(frozen=True)
class Execution:
    device_type: str  # cuda | cpu | ...
    precision: str  # what accelerate's mixed_precision is given: no | bf16 | fp16
    requested_precision: str  # impl.precision (the recipe's value for CUDA)
    compile: bool
    compile_mode: str | None
    fused_adamw: bool

    @property
    def dtype_name(self) -> str:  # the matmul precision, for the peak table of MFU
        return {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}[self.precision]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _get(impl: Any, key: str) -> Any:
    return getattr(impl_config(impl), key)  # the typed view's default where the key is absent or null


def _fused_flag(value: Any) -> str:
    s = str(value).lower()
    return {"1": "true", "0": "false", "yes": "true"}.get(s, s)


def execution_problems(impl: Any) -> list[str]:
    """Bad values of the impl keys this module reads (one line each, with the choices)."""
    out = []
    for key in ("precision", "cpu_precision"):
        v = str(_get(impl, key))
        if v not in PRECISIONS:
            out.append(f"impl.{key}={v!r}: choose no, bf16 or fp16")
    if _fused_flag(_get(impl, "fused_adamw")) not in FUSED_CHOICES:
        out.append(f"impl.fused_adamw={_get(impl, 'fused_adamw')!r}: choose auto, true or false")
    mode = _get(impl, "compile_mode")
    if str(mode) not in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        out.append(f"impl.compile_mode={mode!r}: choose default, reduce-overhead, max-autotune or "
                   "max-autotune-no-cudagraphs (torch.compile's modes)")
    return out


def resolve_execution(impl: Any, device_type: str) -> Execution:
    """What a run on `device_type` uses, from the config's `impl` group. CUDA takes the recipe's precision and compile;
    any other device takes impl.cpu_precision / impl.cpu_compile (fp32, no compile unless asked for)."""
    problems = execution_problems(impl)
    if problems:
        raise ValueError(problems[0])
    requested = str(_get(impl, "precision"))
    on_cuda = device_type == "cuda"
    precision = requested if on_cuda else str(_get(impl, "cpu_precision"))
    compile_ = bool(_get(impl, "compile")) if on_cuda else bool(_get(impl, "cpu_compile"))
    fused = _fused_flag(_get(impl, "fused_adamw"))
    fused_adamw = on_cuda if fused == "auto" else fused == "true"
    mode = str(_get(impl, "compile_mode"))
    return Execution(device_type, precision, requested, compile_, mode if compile_ else None, fused_adamw)


def compile_model(model: Any, execution: Execution) -> Any:
    """torch.compile(model) when the run compiles (the conditioning patches trace: tests/test_conditioning.py)."""
    if not execution.compile:
        return model
    import torch

    mode = None if execution.compile_mode in (None, "default") else execution.compile_mode
    return torch.compile(model, mode=mode)
