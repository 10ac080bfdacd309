"""How a run executes on its device: mixed precision, torch.compile and the fused AdamW kernel.

A recipe states `impl.precision` (accelerate's mixed_precision: "no" | bf16 | fp16) and `impl.compile` for CUDA,
where the official codes trained with AMP. On a CPU the run uses `impl.cpu_precision` and `impl.cpu_compile`
instead (both off by default), so the tests and the smoke and small scales stay fp32 and uncompiled whatever the
recipe says for GPUs. `impl.fused_adamw` (auto | true | false): auto uses torch's fused AdamW kernel on CUDA and the
default implementation elsewhere. None of these changes what is computed beyond the rounding of mixed precision.
What was used goes into summary.json under `execution` (`compile_reason`: why it compiled or not).

Compiling pays only past a break-even: a cold compile costs a fixed CPU time per run, repaid by the time each step
saves. `impl.cpu_compile=auto` compiles a CPU run only when its `task.steps` reach the break-even of its model's
measured costs (`impl.compile_cost.<model.name>`: `compile_s`, the compile's own CPU seconds per run, and
`eager_step_s` / `compiled_step_s`, a step's CPU seconds each way, from `make bench ARGS="--efficiency
--efficiency-args impl.cpu_compile=true"` beside the eager run); with no measurement it does not compile. The compiled
graphs are cached under `paths.cache/torch_compile` (TORCHINDUCTOR_CACHE_DIR), so the cells of a table after the first
find them warm. The diagnostics never compile: they read `Run.eager`, the module inside torch.compile's wrapper
(accelerate's `unwrap_model` keeps the wrapper by default, so reading `Run.raw` made step 0's and the end's
diagnostics compile a graph of their own).
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
    compile_reason: str = ""

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
    for key in ("compile", "cpu_compile"):
        if str(_get(impl, key)).lower() not in ("true", "false", "1", "0", "yes", "no", "auto"):
            out.append(f"impl.{key}={_get(impl, key)!r}: choose true, false or auto (compile past the measured "
                       "break-even, impl.compile_cost)")
    mode = _get(impl, "compile_mode")
    if str(mode) not in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        out.append(f"impl.compile_mode={mode!r}: choose default, reduce-overhead, max-autotune or "
                   "max-autotune-no-cudagraphs (torch.compile's modes)")
    return out


def break_even_steps(compile_s: float, eager_step_s: float, compiled_step_s: float) -> float | None:
    """The steps after which a compiled run has spent less CPU than an eager one: the compile's fixed cost over what
    each step saves; None when a compiled step saves nothing."""
    saved = float(eager_step_s) - float(compiled_step_s)
    return float(compile_s) / saved if saved > 0 else None


def auto_compile(steps: int | None, cost: Any) -> tuple[bool, str]:
    """(compile, why) for `impl.cpu_compile=auto`: only when `steps` reach the break-even of `cost` (the model's
    `impl.compile_cost` entry: compile_s, eager_step_s, compiled_step_s, measured)."""
    if not cost:
        return False, "auto: no measured compile cost for this model (impl.compile_cost): eager"
    even = break_even_steps(cost["compile_s"], cost["eager_step_s"], cost["compiled_step_s"])
    if even is None:
        return False, "auto: a compiled step is not faster (impl.compile_cost): eager"
    if steps is None or steps < even:
        return False, f"auto: {steps} steps < the break-even {even:.0f} (impl.compile_cost): eager"
    return True, f"auto: {steps} steps >= the break-even {even:.0f} (impl.compile_cost): compiled"


def _compile_flag(value: Any) -> str:
    s = str(value).lower()
    return s if s == "auto" else ("true" if s in ("true", "1", "yes") else "false")


def resolve_execution(impl: Any, device_type: str, steps: int | None = None, model: str | None = None) -> Execution:
    """What a run on `device_type` uses, from the config's `impl` group. CUDA takes the recipe's precision and compile;
    any other device takes impl.cpu_precision / impl.cpu_compile (fp32, no compile unless asked for; `auto`: compile
    when the run's `steps` reach its `model`'s measured break-even, `auto_compile`)."""
    problems = execution_problems(impl)
    if problems:
        raise ValueError(problems[0])
    requested = str(_get(impl, "precision"))
    on_cuda = device_type == "cuda"
    precision = requested if on_cuda else str(_get(impl, "cpu_precision"))
    flag = _compile_flag(_get(impl, "compile") if on_cuda else _get(impl, "cpu_compile"))
    key = "impl.compile" if on_cuda else "impl.cpu_compile"
    if flag == "auto":
        costs = _get(impl, "compile_cost") or {}
        compile_, reason = auto_compile(steps, costs.get(str(model)) if model is not None else None)
    else:
        compile_, reason = flag == "true", f"{key}={flag}"
    fused_flag = _fused_flag(_get(impl, "fused_adamw"))
    fused_adamw = on_cuda if fused_flag == "auto" else fused_flag == "true"
    mode = str(_get(impl, "compile_mode"))
    return Execution(device_type, precision, requested, compile_, mode if compile_ else None, fused_adamw, reason)


def _inductor_default_cache() -> str | None:
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # (a torch without it)
        return None
    return default_cache_dir()


def compile_model(model: Any, execution: Execution, cache_dir: Any = None) -> Any:
    """torch.compile(model) when the run compiles (the conditioning patches trace: tests/test_conditioning.py): a
    wrapper around the module, which itself stays eager (`_orig_mod`). `cache_dir`: inductor's cache
    (TORCHINDUCTOR_CACHE_DIR, unless the environment sets one), kept across runs, so later cells of a table compile
    warm."""
    if not execution.compile:
        return model
    import os

    import torch

    if cache_dir is not None and os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, _inductor_default_cache()):
        # (inductor writes its default into the environment the first time anything asks for its cache: a value equal
        # to that default was not the user's)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)

    mode = None if execution.compile_mode in (None, "default") else execution.compile_mode
    return torch.compile(model, mode=mode)
