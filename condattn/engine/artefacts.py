"""The artefacts a run needs once its steps are done, checked before it resumes (resume=auto, rank 0, under the run's
lock): `summary.json`, `best_model.pt` (the weights its test metric is taken with) and its `tokenizer.json` copy.

A corrupt one (truncated, zero bytes, another format) is set aside as `<name>.corrupt` (kept for inspection, like an
unreadable checkpoint) with one line naming it, and the run is repaired from what remains:

- summary.json: the run resumes from its last checkpoint, which holds every step: it is evaluated again and its
  summary written again (no checkpoint: it trains again from step 0);
- best_model.pt: rebuilt from the checkpoint of the best-validation step when one is kept; else the run resumes from
  the newest checkpoint before that step, so training reaches it again and writes the best weights again (on the CPU
  the resumed steps are bit-identical); else it trains again from step 0, the message saying which file forced it. A
  finished run keeps its summary (its test metric was taken before the file broke): the line says so;
- tokenizer.json: the data cache's tokenizer is copied in again when the run's data is built (engine/setup.py
  keep_tokenizer).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from ..runs import RunRecord, list_checkpoints, set_aside, unreadable_json, unreadable_tokenizer

STATE_FILE = "custom_checkpoint_0.pkl"  # accelerate's file of the registered TrainState (engine/state.py)


def _say(msg: str) -> None:
    print(f"[condattn] {msg}", file=sys.stderr, flush=True)


def unreadable_weights(path: Path) -> str | None:
    """Why `path` is not a state dict torch can load (None: it is one)."""
    if path.stat().st_size == 0:
        return "it is empty (0 bytes)"
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - truncated zip, not a torch file, a pickle of something else
        first = (str(e).strip().splitlines() or [""])[0].split(". ")[0]  # torch's own advice follows: dropped
        return f"torch cannot load it: {type(e).__name__}: {first}"
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        return f"it holds a {type(obj).__name__}, not a model's state dict"
    return None


def best_step(checkpoint: Path) -> int | None:
    """The best-validation step recorded in a checkpoint's state (None: unreadable, or no evaluation yet)."""
    try:
        state = torch.load(checkpoint / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - an unreadable checkpoint: resume sets it aside
        return None
    step = state.get("best_step") if isinstance(state, dict) else None
    return int(step) if isinstance(step, int) and step >= 0 else None


def _ckpt_step(ckpt: Path) -> int:
    return int(ckpt.name.split("_")[-1])


def repair(run_dir: str | Path, say: Callable[[str], None] = _say) -> list[str]:
    """Set aside the run's corrupt artefacts and prepare what the run needs to make them again (see the module doc);
    returns the lines said."""
    record = RunRecord(run_dir)
    said: list[str] = []

    def tell(msg: str) -> None:
        said.append(msg)
        say(msg)

    if record.summary_path.exists() and record.status == "corrupt":
        why = unreadable_json(record.summary_path) or "it says finished but holds no metrics"
        moved = set_aside(record.summary_path)
        ckpt = record.latest_checkpoint()
        tell(f"{record.summary_path} is unreadable ({why}); set it aside as {moved.name}; " +
             (f"evaluating the run again from its last checkpoint {ckpt.name}" if ckpt else
              "no checkpoint remains: training the run again from step 0"))
    if record.best_model_path.exists() and (why := unreadable_weights(record.best_model_path)):
        moved = set_aside(record.best_model_path)
        head = f"{record.best_model_path} is unreadable ({why}); set it aside as {moved.name}"
        tell(f"{head}; {_best_weights_again(record)}")
    tok = record.dir / "tokenizer.json"
    if tok.exists() and (why := unreadable_tokenizer(tok)):
        moved = set_aside(tok)
        tell(f"{tok} is unreadable ({why}); set it aside as {moved.name}; the data cache's tokenizer is copied in "
             "again when the run's data is built")
    return said


def repair_finished(run_dir: str | Path, say: Callable[[str], None] = _say) -> list[str]:
    """`repair` for a finished run that `reproduce` skips, when an artefact looks broken (cheap: the sizes and zip
    directories; `repair` then checks in full), so a table never reads from a run `train` would have repaired."""
    import zipfile

    record = RunRecord(run_dir)
    best, tok = record.best_model_path, record.dir / "tokenizer.json"
    broken = (best.exists() and (best.stat().st_size == 0 or not zipfile.is_zipfile(best))) or \
        (tok.exists() and tok.stat().st_size == 0)
    return repair(run_dir, say) if broken else []


def _best_weights_again(record: RunRecord) -> str:
    """Make the best-validation weights come back (see the module doc); what was done, in words. The same rule for a
    finished run (found by `train` or by `reproduce`) as for one still training: rebuilt from the best step's
    checkpoint when it is kept."""
    ckpts = list_checkpoints(record.dir)
    best = next((b for c in reversed(ckpts) if (b := best_step(c)) is not None), None)
    at = [c for c in ckpts if best is not None and _ckpt_step(c) == best and (c / "model.safetensors").is_file()]
    if at:
        from safetensors.torch import load_file

        tmp = record.dir / ".best_model.pt.tmp"
        torch.save(load_file(str(at[0] / "model.safetensors")), tmp)
        tmp.replace(record.best_model_path)
        return f"rebuilt it from {at[0].name} (the best-validation step {best})"
    if record.finished:
        return ("the run had finished, so its summary stands (its test metric was taken with those weights before the "
                "file broke); no checkpoint of its best-validation step is kept, so those weights are lost "
                "(resume=never trains the run again)")
    if not ckpts:
        return "no checkpoint remains: training the run again from step 0 (forced by the corrupt best_model.pt)"
    if best is None:
        return "no checkpoint records an evaluation yet: the weights are written again at the next one"
    before = [c for c in ckpts if _ckpt_step(c) < best]
    for c in ckpts:
        if not before or _ckpt_step(c) > _ckpt_step(before[-1]):
            shutil.rmtree(c)
    if before:
        return (f"no checkpoint of the best-validation step {best} is kept: resuming from {before[-1].name}, before "
                "it, so training reaches that step again and writes the best weights again")
    return (f"no checkpoint at or before the best-validation step {best} is kept: training the run again from step 0 "
            "(forced by the corrupt best_model.pt)")
