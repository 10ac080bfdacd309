"""results/medium/claim_vit_cet.{json,md}: the medium-scale claim's test accuracies per arm at B and 2B, Δ (CET −
baseline) with Welch's 95 % interval and p, the MDE from both arms' spread, a verdict at each budget, and Δ's trend
from B to 2B; with provenance (commit, device, torch, seeds, steps, wall time)."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

import torch

from .engine import provenance
from .reporting.fmt import fmt_p
from .stats import mde, mean_std, welch_ci, welch_p


def verdict(ci, m: float | None) -> str:
    if ci.low > 0:
        return "CET better"
    if ci.high < 0:
        return "CET worse"
    return f"no difference detected (MDE {m:.2f} points)" if m is not None else "no difference detected"


def budget_row(base: list[float], cet: list[float], steps: int) -> dict:
    ci = welch_ci(base, cet)
    (mb, sb), (mc, sc) = mean_std(base), mean_std(cet)
    m = mde(math.sqrt((sb * sb + sc * sc) / 2), min(len(base), len(cet)))
    return {"steps": steps, "baseline": {"mean": mb, "std": sb, "acc": base},
            "CET": {"mean": mc, "std": sc, "acc": cet},
            "delta": ci.diff, "ci95": [ci.low, ci.high], "p_welch": welch_p(base, cet), "mde": m,
            "verdict": verdict(ci, m)}


def trend(r1: dict, r2: dict) -> dict:
    """Δ(2B) − Δ(B) with a normal-approximation 95 % interval (the four groups are independent runs)."""
    var = sum(r[a]["std"] ** 2 / len(r[a]["acc"]) for r in (r1, r2) for a in ("baseline", "CET"))
    d = r2["delta"] - r1["delta"]
    return {"change": d, "ci95": [d - 1.96 * math.sqrt(var), d + 1.96 * math.sqrt(var)],
            "method": "normal approximation, independent runs"}


def write(out: Path, acc: dict, arms: list[str], steps: int, seeds: list[int], info: dict) -> tuple[Path, Path]:
    rows = [budget_row(acc[("baseline", s)], acc[("CET", s)], s) for s in (steps, 2 * steps)]
    tr = trend(*rows)
    device = info["device"]
    hw = provenance.describe(provenance.hardware(device, 1))
    prov = {"commit": provenance.git_commit(), "device": hw, "torch": torch.__version__, "seeds": seeds,
            "steps": [steps, 2 * steps], "mode": info["mode"], "wall_s": info["wall_s"],
            "projected_s": info["projected_s"], "data": str(info["data"]), "data_sha256": info["checksum"],
            "model": info["model"], "recipe": info["recipe"],
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    out.mkdir(parents=True, exist_ok=True)
    mod, rec = info["model"], info["recipe"]
    js, md = out / "claim_vit_cet.json", out / "claim_vit_cet.md"
    js.write_text(json.dumps({"claim": "table 1 ViT row: CET (embedded) vs baseline (none), CIFAR-100 top-1 test acc",
                              "arms": arms, "budgets": rows, "trend": tr, "provenance": prov}, indent=2, default=str))
    lines = ["# Medium-scale claim: table 1's ViT row, CET vs baseline on CIFAR-100 (test top-1, %)", "",
             f"{len(seeds)} seeds per arm (seeds {seeds[0]}-{seeds[-1]}), each run trained for B = {steps} or 2B = "
             f"{2 * steps} steps at batch {info['recipe']['batch']} (crop + flip; python -m condattn.medium_claim). "
             f"Commit {prov['commit']}, {hw}, torch {prov['torch']}, mode {info['mode']}, {prov['wall_s']} s in all "
             f"(projected {prov['projected_s']} s), {prov['date']}.", "",
             f"Model {mod.get('name')} ({mod['depth']} blocks × {mod['embed_dim']}, patch {mod['patch_size']}); "
             f"recipe: the medium scale's AdamW (lr {rec['lr']}, weight decay {rec['weight_decay']}), label smoothing "
             f"{rec['label_smoothing']}, drop-path {mod.get('drop_path_rate', 0)}, warm-up over 10 % of the steps "
             "then cosine, with random crop (4-px padding) and flip only (no RandAugment, mixup, CutMix or erasing); "
             "one lr for both arms.", "",
             "| steps | baseline | CET | Δ (CET − baseline) [Welch 95 %] | p (Welch) | MDE | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        b, c = r["baseline"], r["CET"]
        lines.append(f"| {r['steps']} | {b['mean']:.2f} ± {b['std']:.2f} | {c['mean']:.2f} ± {c['std']:.2f} | "
                     f"{r['delta']:+.2f} [{r['ci95'][0]:+.2f}, {r['ci95'][1]:+.2f}] | {fmt_p(r['p_welch'])} | "
                     f"{r['mde']:.2f} | {r['verdict']} |")
    agree = rows[0]["verdict"].split(" (")[0] == rows[1]["verdict"].split(" (")[0]
    lines += ["", f"Δ(2B) − Δ(B) = {tr['change']:+.2f} [{tr['ci95'][0]:+.2f}, {tr['ci95'][1]:+.2f}] ({tr['method']}); "
              f"the verdicts at B and 2B {'agree' if agree else 'differ'}.", "",
              "MDE: the two-sided Welch test's minimum detectable effect at 80 % power, α = 0.05, from both arms' "
              "spread (√((s_b² + s_c²)/2)). Mean ± sample std over seeds.", ""]
    md.write_text("\n".join(lines))
    return js, md
