"""What a cell costs before it is queued: training FLOPs per sample (counted, engine/flops.py), × the samples its
recipe trains on, → GPU-hours at an assumed MFU on the launcher's GPU type (`launcher.gpu_type`,
`launcher.assumed_mfu`); and whether `launcher.cpus_per_task` data workers can decode images as fast as that GPU
consumes them.

FLOPs per sample are counted on one synthetic micro-batch of the cell's input shape (image size, sequence length)
through the model the cell builds, conditioning included, on the meta device (no memory, no weights; CET's
correction alone runs on a random CPU token matrix of its input's shape), else on the CPU with 2 samples.
Only the training steps are counted (evaluation adds a forward pass over the validation split per evaluation);
detection cells are not estimated (their FLOPs depend on each image's size and the number of proposals).

`machine_projection` is the other figure a local dry run prints: the cells' time on this machine, from the seconds per
step that finished runs of the same model, data and method took on this kind of device (their summaries' wall time),
never guessed: a recipe no such run has measured is counted as unmeasured.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from ..utils.typed_config import impl_config, task_config
from .flops import peak_flops, training_step_flops
from .precision import resolve_execution

_COUNT_BATCH = 2
# a CPU count runs the model for real: one sample (FLOPs per sample are the same at any batch; GPT-2 124M at 1,024
# tokens: 408.5 GFLOP per sample at batch 1 and at 2, counted in about half the time)
_CPU_COUNT_BATCH = 1
_CACHE: dict[str, tuple[float | None, str]] = {}


def _synthetic_batch(cfg: Any, n: int, device: torch.device) -> dict[str, torch.Tensor] | None:
    """A micro-batch of n samples shaped as the cell's data (values do not change matmul FLOPs); None for detection."""
    kind, data = str(cfg.task.kind), cfg.data
    g = torch.Generator().manual_seed(0)
    if kind == "detection":
        return None
    if data.get("builder") == "images":
        s = int(data.img_size)
        return {"pixel_values": torch.randn(n, 3, s, s, generator=g).to(device),
                "labels": torch.zeros(n, dtype=torch.long, device=device)}
    seq = int(data.seq_len)
    vocab = int(cfg.model.get("vocab_size") or data.get("vocab_size") or 100)  # ids inside the model's embedding
    ids = torch.randint(min(5, vocab - 1), min(100, vocab), (n, seq), generator=g).to(device)
    mask = torch.ones_like(ids)
    if data.get("builder") == "lra_retrieval":
        return {"input_ids_0": ids, "attention_mask_0": mask, "input_ids_1": ids, "attention_mask_1": mask}
    batch = {"input_ids": ids, "attention_mask": mask}
    if kind == "mlm":
        p = float(task_config(cfg.task).mlm_probability)
        batch["labels"] = torch.where(torch.rand(n, seq, generator=g).to(device) < p, ids, torch.full_like(ids, -100))
    return batch


def _loss_fn(cfg: Any, batch: dict[str, torch.Tensor]) -> Callable[[torch.nn.Module], torch.Tensor]:
    from ..tasks import TASKS

    forward = TASKS[str(cfg.task.kind)].forward  # the task's own forward (static): the model as the trainer calls it

    def loss(model: torch.nn.Module) -> torch.Tensor:
        out = forward(model, batch)
        out = out.logits if hasattr(out, "logits") else out
        return out.float().sum()

    return loss


@contextmanager
def _meta_friendly():
    """What lets a conditioned model run on the meta device: SCA's identity index (`nonzero`, whose meta kernel
    assumes every entry non-zero: true of an identity's pattern) and CET's correction, which reads values (its
    convergence check) and so runs for real on a random CPU token matrix of the same shape; its FLOPs are counted
    by the surrounding counter all the same (the correction's input is detached by default: no backward)."""
    import torch.fx.experimental._config as fx_config

    from ..conditioning import embedded

    original = embedded.polar_correction

    def correction(x: torch.Tensor, mask: torch.Tensor | None = None, **opts: Any) -> torch.Tensor:
        if x.device.type != "meta":
            return original(x, mask, **opts)
        original(torch.randn(x.shape, generator=torch.Generator().manual_seed(0), device="cpu"), None, **opts)
        return x

    embedded.polar_correction = correction
    try:
        with fx_config.patch(meta_nonzero_assume_all_nonzero=True):
            yield
    finally:
        embedded.polar_correction = original


def _count_on(cfg: Any, device: torch.device, n: int = _COUNT_BATCH) -> float:
    from ..conditioning import apply_conditioning
    from ..conditioning.spec import BASELINE, conditioning_spec, method_of_parts, method_spec
    from ..models import build_model

    mcfg = OmegaConf.to_container(cfg.model, resolve=True)
    for key in ("pretrained", "use_pretrained_backbone"):
        if key in mcfg:
            mcfg[key] = False
    mcfg.pop("init_from", None)
    mcfg.pop("backbone_checkpoint", None)
    with torch.random.fork_rng(devices=[]), torch.device(device):  # the caller's RNG stream is left as it was
        model = build_model(mcfg).train()
        spec = conditioning_spec(cfg.conditioning)
        # a part init-only under these options (MethodSpec.once: conditioned_init, SCA with mode=init) changes the
        # weights once: no per-step cost (CET beside it keeps its); the rest is the method registered for those parts
        # (qk_norm+spectral applies spectral, then qk_norm)
        timed = [m for m in spec.parts if not method_spec(m).once(spec.values)]
        method = method_of_parts(timed) if timed else BASELINE
        own = method_spec(method).options  # (an option of a part left out would be refused as another method's)
        apply_conditioning(model, method, **{k: v for k, v in spec.values.items() if k in own})
        batch = _synthetic_batch(cfg, n, device)
        with _meta_friendly() if device.type == "meta" else nullcontext():
            return training_step_flops(model, _loss_fn(cfg, batch)) / n


def training_flops_per_sample(cfg: Any) -> tuple[float | None, str]:
    """(forward + backward FLOPs per training sample, how it was counted) of the model a cell trains; None with the
    reason when it cannot be counted."""
    try:
        if _synthetic_batch(cfg, 1, torch.device("meta")) is None:
            return None, "detection: FLOPs depend on each image's size (not estimated)"
        key = OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, ["model", "data", "conditioning", "task"]))
    except Exception as e:  # noqa: BLE001 - an input shape this module does not know: no estimate, no failure
        return None, f"could not count: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    if key not in _CACHE:
        try:
            _CACHE[key] = (_count_on(cfg, torch.device("meta")), "counted on the meta device")
        except Exception:  # an op without a meta kernel, or one reading values (CET's convergence check)
            try:
                _CACHE[key] = (_count_on(cfg, torch.device("cpu"), _CPU_COUNT_BATCH),
                               f"counted on CPU at batch {_CPU_COUNT_BATCH}")
            except Exception as e:  # noqa: BLE001 - an estimate must never stop a dry run
                _CACHE[key] = (None, f"could not count: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    return _CACHE[key]


@dataclass
class CellCost:
    name: str
    flops_per_sample: float | None
    samples: int
    precision: str  # matmul precision on CUDA (fp32 | bf16 | fp16)
    gpus: int
    gpu_hours: float | None  # training and evaluation, all processes
    note: str = ""
    eval_hours: float | None = None  # the part of gpu_hours spent evaluating (None: not estimated)
    measured: str | None = None  # where the step time was measured (make bench), None: counted FLOPs and assumptions

    @property
    def total_flops(self) -> float | None:
        return None if self.flops_per_sample is None else self.flops_per_sample * self.samples

    @property
    def wall_hours(self) -> float | None:
        """One cell's wall time: its GPU-hours over its processes."""
        return None if self.gpu_hours is None else self.gpu_hours / max(self.gpus, 1)


def launcher_gpu(cfg: Any) -> tuple[str, float]:
    lc = cfg.get("launcher") or {}
    return str(lc.get("gpu_type") or "H100"), float(lc.get("assumed_mfu") or 0.4)


# `make bench` model -> (model.name of the cells it stands for, the sequence length it was timed at: a cell at another
# length scales its time per sample linearly; None: the same input as the cell)
BENCH_MODELS = {"nystromformer_lra_listops": (("nystromformer_lra", "nystromformer_lra_dual"), 2048),
                "crammed_bert": (("crammed_bert",), None)}
def bench_arm(conditioning: Any) -> str | None:
    """The `make bench` arm that times a cell's `conditioning` node: of the first part that costs per step (not
    init-only under its options, MethodSpec.once), the arm (MethodSpec.bench_arms) whose options the cell's match,
    the most specific (CET with solver=svd: CET-svd); the baseline's arm when every part is init-only; None for a
    part the bench does not time, or a node that is not a valid conditioning."""
    from ..conditioning.spec import BASELINE, conditioning_spec, method_spec

    try:
        spec = conditioning_spec(conditioning)
    except ValueError:
        return None
    timed = [m for m in spec.parts if not method_spec(m).once(spec.values)] or [BASELINE]
    arms = method_spec(timed[0]).bench_arms
    fits = [(len(opts), arm) for arm, opts in arms.items() if all(spec.values.get(k) == v for k, v in opts.items())]
    return max(fits, key=lambda f: f[0])[1] if fits else None


def _bench_files(cfg: Any) -> list[Path]:
    lc = cfg.get("launcher") or {}
    folder = lc.get("bench_dir")
    if folder is None:
        return []
    root = Path(str(folder))
    if not root.is_absolute():  # relative to the project root (where configs/ lives), not the current directory
        from ..config import CONFIG_DIR

        root = CONFIG_DIR.parent / root
    return sorted(root.glob("*.json")) if root.is_dir() else []


def measured_step(cfg: Any) -> tuple[float, str] | None:
    """(seconds per training sample on one process, where it was measured) from a `make bench` result on the launcher's
    GPU type (launcher.gpu_type in the device name, launcher.bench_dir) for this cell's model and method at its matmul
    precision; None when no bench run measured them."""
    gpu = launcher_gpu(cfg)[0].lower()
    name, arm = str(cfg.model.get("name")), bench_arm(cfg.conditioning)
    if arm is None:
        return None
    precision = resolve_execution(cfg.impl, "cuda").dtype_name
    for f in _bench_files(cfg):
        try:
            import json

            rec = json.loads(f.read_text())
            hw = rec.get("hardware") or {}
            if hw.get("device_type") != "cuda" or gpu not in str(hw.get("device_name", "")).lower():
                continue
            for r in rec.get("results", []):
                # bf16 and fp16 both run on the half-precision tensor cores: a bf16 bench times an fp16 cell
                half = {"bf16", "fp16"}
                same = (r.get("precision") in half) == (precision in half)
                models, seq = BENCH_MODELS.get(r.get("model"), ((r.get("model"),), None))
                if name not in models or arm not in r.get("arms", {}) or not same:
                    continue
                per_sample = float(r["arms"][arm]["step_ms"]) / 1000 / int(r["batch"])
                if seq and cfg.data.get("seq_len"):
                    per_sample *= int(cfg.data.seq_len) / seq
                return per_sample, (f"measured: {r['arms'][arm]['step_ms']} ms a step at batch {r['batch']} "
                                    f"({r['model']}, {arm}) on {hw.get('device_name')}, {f.name}")
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def _training_hours(cfg: Any, fps: float | None, how: str, gpus: int) -> tuple[float | None, str, str | None]:
    """(training GPU-hours, note, where the step time was measured) from a measured step time where `make bench` left
    one, else from the counted FLOPs at the assumed MFU, the data workers' rate and the assumed per-step floor."""
    samples = int(cfg.task.steps) * int(cfg.task.batch_size)
    if (m := measured_step(cfg)) is not None:
        per_sample, where = m
        return samples * per_sample / 3600, f"{how}; {where}", where
    gpu, mfu = launcher_gpu(cfg)
    ex = resolve_execution(cfg.impl, "cuda")
    peak = peak_flops(gpu, ex.dtype_name)
    hours, note = None, how
    if fps is not None and peak:
        hours = fps * samples / (peak * mfu) / 3600
        note += f"; assumed: {mfu:.0%} MFU (no make bench result for {cfg.model.get('name')} on {gpu})"
    elif fps is not None:
        note += f"; no peak for {gpu} at {ex.dtype_name}"
    rate = worker_rate(cfg)
    lc = cfg.get("launcher") or {}
    if hours is not None and rate and lc.get("cpus_per_task"):  # small models: the data loader, not the GPU, is the
        workers = max(int(lc.cpus_per_task) - 1, 1)              # limit (each process feeds its own workers)
        loader_hours = samples / (workers * rate * gpus) / 3600 * gpus
        if loader_hours > hours:
            hours, note = loader_hours, (f"{note}; loader-bound: {workers} worker(s) × {rate:.0f} samples/s per "
                                         "process (impl.worker_samples_per_s)")
    floor_ms = lc.get("min_step_ms")
    if hours is not None and floor_ms:  # tiny models (LRA, CIFAR): per-step overheads, not FLOPs, set the time
        step_hours = int(cfg.task.steps) * float(floor_ms) / 1000 / 3600 * gpus
        if step_hours > hours:
            hours, note = step_hours, (f"{note}; step-bound: launcher.min_step_ms={floor_ms} per step (assumed; "
                                       "`make bench` on the target GPU measures it)")
    return hours, note, None


def eval_samples(cfg: Any) -> int | None:
    """Validation samples one evaluation reads (impl.val_samples by data.source, data.name, then data.builder; a
    generated split's own size), or None."""
    gen = cfg.data.get("generate")
    if gen and gen.get("val"):
        return int(gen.val)
    sizes = impl_config(cfg.impl).val_samples or {}
    for key in (cfg.data.get("source"), cfg.data.get("name"), cfg.data.get("builder")):
        if key is not None and sizes.get(str(key)):
            return int(sizes[str(key)])
    return None


def cell_cost(name: str, cfg: Any) -> CellCost:
    from .preflight import planned_world

    ex = resolve_execution(cfg.impl, "cuda")
    fps, how = training_flops_per_sample(cfg)
    samples = int(cfg.task.steps) * int(cfg.task.batch_size)
    gpus = planned_world(cfg)
    hours, note, measured = _training_hours(cfg, fps, how, gpus)
    eval_hours = None
    if hours is not None:  # an evaluation is a forward pass (≈ 1/3 of a training step's time per sample)
        n_val = eval_samples(cfg)
        if n_val:
            evals = int(cfg.task.steps) // int(cfg.task.eval_every) + 1
            eval_hours = hours * evals * n_val / (3 * samples)
            hours += eval_hours
            note += f"; evaluation: {evals} × {n_val:,} validation samples"
        else:
            note += "; evaluation not estimated (impl.val_samples has no entry for this data)"
    budget = task_config(cfg.task).budget_hours
    if budget:  # a wall-clock budget ends the run first when it is shorter
        cap = float(budget) * gpus
        if hours is None or hours > cap:
            hours, note = cap, f"{note}; the {budget} h wall-clock budget × {gpus} GPU(s) ends it first"
    return CellCost(name, fps, samples, ex.dtype_name, gpus, hours, note, eval_hours, measured)


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "–"
    for scale, suffix in ((1e21, "Z"), (1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {suffix}{unit}"
    return f"{x:.3g} {unit}"


def worker_rate(cfg: Any) -> float | None:
    """One data worker's measured training samples/s for this data (impl.worker_samples_per_s, looked up by
    data.source, then data.builder), or None."""
    rates = impl_config(cfg.impl).worker_samples_per_s
    for key in (cfg.data.get("source"), cfg.data.get("builder")):
        if key is not None and rates.get(str(key)):
            return float(rates[str(key)])
    return None


def loader_warning(cfg: Any, flops_per_sample: float | None) -> str | None:
    """A line when `launcher.cpus_per_task` - 1 data workers decode fewer images per second than one GPU process
    consumes at the assumed MFU (impl.worker_samples_per_s: one worker's measured rate, `make bench --loader`)."""
    lc = cfg.get("launcher") or {}
    rate = worker_rate(cfg)
    if not flops_per_sample or not rate or not lc.get("cpus_per_task"):
        return None
    gpu, mfu = launcher_gpu(cfg)
    peak = peak_flops(gpu, resolve_execution(cfg.impl, "cuda").dtype_name)
    if not peak:
        return None
    need = peak * mfu / flops_per_sample  # samples/s one GPU process trains at
    workers = max(int(lc.cpus_per_task) - 1, 1)
    have = workers * float(rate)
    if have >= need:
        return None
    cpus = int(need / float(rate)) + 2
    head = (f"launcher.cpus_per_task={lc.cpus_per_task}: {workers} data worker(s) × {float(rate):.0f} samples/s "
            f"(impl.worker_samples_per_s) = {have:.0f} samples/s, but one {gpu} at {mfu:.0%} MFU trains "
            f"{need:.0f} samples/s; ")
    faster = "a faster loader: make bench ARGS=\"--loader imagenet\""
    procs = max(int(lc.get("gpus_per_node") or 1), 1)
    node = int(lc.get("cpus_per_node") or 0) // procs  # the most one process can have: a node's cores / its processes
    if node and cpus > node:
        if int(lc.cpus_per_task) >= node:
            return head + f"a node's cores are all in use (launcher.cpus_per_node); the loader sets the pace ({faster})"
        return (head + f"set launcher.cpus_per_task={node} (all of a {lc.cpus_per_node}-core node's cores per process, "
                f"launcher.cpus_per_node); it needs {cpus}, so the loader still sets the pace ({faster})")
    return head + f"set launcher.cpus_per_task={cpus} or more (or {faster})"


def describe_cost(table: str, cells: list[tuple[str, Any]]) -> list[str]:
    """The dry run's cost lines: one per cell, the total, and the loader warnings."""
    if not cells:
        return []
    gpu, mfu = launcher_gpu(cells[0][1])
    costs = [cell_cost(name, copy.deepcopy(cfg)) for name, cfg in cells]
    lines = [f"[reproduce] cost estimate ({gpu}, launcher.gpu_type; training steps and evaluations; a step time "
             "measured by `make bench` on that GPU where there is one, else FLOPs counted with "
             f"torch.utils.flop_counter at {mfu:.0%} MFU, launcher.assumed_mfu):"]
    for c in costs:
        lines.append(f"  {c.name}: {_fmt(c.flops_per_sample, 'FLOP')}/sample × {c.samples:,} samples = "
                     f"{_fmt(c.total_flops, 'FLOP')} at {c.precision} → "
                     f"{'–' if c.gpu_hours is None else f'{c.gpu_hours:,.1f}'} GPU-hours ({c.note})")
    known = [c for c in costs if c.gpu_hours is not None]
    total = sum(c.gpu_hours for c in known)
    flops = sum(c.total_flops or 0.0 for c in costs)
    missing = f" ({len(costs) - len(known)} cell(s) not estimated)" if len(known) < len(costs) else ""
    lines.append(f"[reproduce] {table}: {len(costs)} runs, {_fmt(flops, 'FLOP')}, ≈ {total:,.0f} GPU-hours on {gpu} "
                 f"at {mfu:.0%} MFU{missing}")
    fastest: dict[str, tuple[str, Any, float]] = {}  # per model: the cell that trains most samples/s (fewest FLOPs)
    for (name, cfg), c in zip(cells, costs):
        model = str(cfg.model.get("name"))
        if c.flops_per_sample and (model not in fastest or c.flops_per_sample < fastest[model][2]):
            fastest[model] = (name, cfg, c.flops_per_sample)
    for model, (name, cfg, fps) in fastest.items():
        if w := loader_warning(cfg, fps):
            lines.append(f"[reproduce] warning: {model}: {w} [{name}]")
    return lines


def recipe(cfg: Any) -> tuple[str, str, str]:
    """What a step's time depends on here: the model, the data and the method (a run's resolved config)."""
    get = lambda part, key: str((cfg.get(part) or {}).get(key))  # noqa: E731
    return get("model", "name"), get("data", "name"), get("conditioning", "method")


FIXED_CAUSES = ("startup", "data", "step0", "test", "end_diag", "other")  # runcost.CAUSES paid once per run


def run_cost(summary: dict) -> tuple[float, float] | None:
    """(seconds per training step, fixed seconds per run) of one finished run. Where the run recorded its CPU split by
    cause (`performance.cpu_split`, engine/runcost.py), from it: training, evaluations and checkpoints per step (they
    recur with the steps), start-up (imports, config, model), data, diagnostics and the test once per run. Else its
    training clock over its steps and the rest of its wall time as fixed (`train_time_s`, `wall_time_s`), or, without
    a training clock, its whole wall time per step (no fixed part)."""
    steps = int(summary.get("steps") or 0)
    if steps <= 0:
        return None
    split = (summary.get("performance") or {}).get("cpu_split")
    if split and split.get("seconds"):
        sec = split["seconds"]
        per_step = sum(float(sec.get(k, 0.0)) for k in ("train", "eval", "checkpoint")) / steps
        return per_step, sum(float(sec.get(k, 0.0)) for k in FIXED_CAUSES)
    if not summary.get("wall_time_s"):
        return None
    wall, train = float(summary["wall_time_s"]), float(summary.get("train_time_s") or 0.0)
    return (train / steps, max(0.0, wall - train)) if 0 < train <= wall else (wall / steps, 0.0)


def measured_steps(dirs: list[Path], device_type: str | None = None
                   ) -> dict[tuple[str, str, str], tuple[float, float, set]]:
    """{recipe: (the median seconds per training step, the median fixed seconds of a run, the hardware lines of the
    runs measured)} over the finished runs under `dirs` (run roots and kept records), only those that ran on
    `device_type` when given; (model, data, "*"): over every method, for a method not measured yet. A run's step time
    is its training clock over its steps (`train_time_s`), its fixed cost the rest of its wall time (evaluations,
    checkpoints, diagnostics: `wall_time_s` − `train_time_s`), so a run of another length is projected as fixed + steps
    × step time; a record without a training clock counts its whole wall time per step (no fixed part). A run that
    recorded its CPU split by cause is read from it instead (`run_cost`: start-up included)."""
    from ..runs import RunRecord, kept_records

    seen: dict[tuple[str, str, str], list[tuple[float, float, str]]] = {}
    for d in dirs:
        found = [RunRecord(f.parent) for f in d.glob("*/summary.json")] + kept_records(d) if d.is_dir() else []
        for rec in found:
            s = rec.summary
            if not (s and isinstance(s.get("config"), dict)) or (cost := run_cost(s)) is None:
                continue
            if device_type is not None and (s.get("hardware") or {}).get("device_type") != device_type:
                continue
            step, fixed = cost
            model, data, method = recipe(s["config"])
            for key in ((model, data, method), (model, data, "*")):
                seen.setdefault(key, []).append((step, fixed, str(s.get("hardware_line") or "unknown hardware")))

    def median(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    return {k: (median([x for x, _, _ in v]), median([f for _, f, _ in v]), {h for _, _, h in v})
            for k, v in seen.items()}


def run_seconds(step_s: float, fixed_s: float, steps: int) -> float:
    """A run's projected seconds: its fixed cost plus its steps at the measured step time (`measured_steps`)."""
    return fixed_s + step_s * steps


def machine_projection(cells: list[tuple[str, Any]], dirs: list[Path]) -> str:
    """One line: these cells' time on this machine, one after another, at the seconds per step that finished runs of
    their recipe measured on this kind of device (`measured_steps`), with the hardware they ran on; cells of recipes
    no such run measured are counted, not guessed."""
    import os

    device = "cuda" if torch.cuda.is_available() else "cpu"
    steps = measured_steps(dirs, device)
    seconds, hardware, unmeasured = 0.0, set(), 0
    for _, cfg in cells:
        model, data, method = recipe(cfg)
        got = steps.get((model, data, method)) or steps.get((model, data, "*"))
        if got is None:
            unmeasured += 1
            continue
        seconds += run_seconds(got[0], got[1], int(cfg.task.steps))
        hardware |= got[2]
    here = (torch.cuda.get_device_name(0) if device == "cuda" else
            f"cpu, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}")
    known = len(cells) - unmeasured
    line = f"[reproduce] on this machine ({here}): "
    line += (f"≈ {seconds / 3600:.2f} h for {known} of {len(cells)} cells, one after another (measured: each run's "
             "fixed cost, the part of a finished run's wall time outside its training steps, plus its steps at the "
             f"median seconds per step, of finished runs of the same model, data and method on {device}, which ran "
             f"on {'; '.join(sorted(hardware))}; a process's start-up before its run's clock is in no record)"
             if known else
             f"no estimate: no finished run of these cells' model, data and method ran on {device}")
    if known and unmeasured:
        line += f"; {unmeasured} cell(s) of recipes no finished run on {device} has measured, not counted"
    return line
