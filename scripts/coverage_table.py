"""Write docs/coverage.md: which timm families and transformers types SCA and today's attention fixes patch
(condattn/conditioning/coverage.py).

    .venv/bin/python scripts/coverage_table.py
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import torch

from condattn.conditioning.coverage import (
    RIVALS,
    markdown,
    rival_rows,
    smallest_timm_model,
    timm_rows,
    transformers_rows,
)


def _not_covered(rows) -> list[str]:
    """The timm families not covered on every layer, each with its one-line reason, and what the denominator counts."""
    missing = [r for r in rows if not r.full]
    if not missing:
        return []
    noqk = sorted(r.family for r in missing if "no q·kᵀ" in r.why)
    out = [f"Not covered on every attention layer ({len(missing)} timm families; each refused in one line, or patched "
           "on its other layers with partial=True):", ""]
    out += [f"- {r.family} ({r.patched} of {r.attention}): {r.why.split(': ', 1)[-1]}" for r in missing]
    out += ["", f"The timm denominator counts every model module with a layer whose class name says attention, so it "
            f"includes layers without q·kᵀ logits, which SCA has nothing to condition in ({', '.join(noqk)}).", ""]
    return out


def _rivals() -> list[str]:
    """The 2025 rivals on the same transformers types: layers patched (of those found; forward finite, removed), or
    the one-line refusal."""
    rows = rival_rows()
    full = {m: sum(bool(re.fullmatch(r"(\d+)/\1", r[i])) for _, r in rows) for i, m in enumerate(RIVALS)}
    out = ["## The 2025 rivals", "",
           "Each of `gated_attention`, `softcap`, `attention_sink` and `qk_clip` applied alone to the same tiny "
           "transformers configs: attention layers patched of those found (the forward run, finite; then removed), "
           "or the method's one-line refusal. Soft-capping, the sink and QK-clip need the logits, so they reach "
           "layers that call F.scaled_dot_product_attention or transformers' attention interface (methods/logits.py); "
           "the gate needs a W_O called as a module.", "",
           "- " + "; ".join(f"{m}: {full[m]} of {len(rows)} types on every layer" for m in RIVALS), "",
           "| type | " + " | ".join(RIVALS) + " |", "|---|" + "---|" * len(RIVALS)]
    out += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows]
    return [*out, ""]


def _timm_reach(name: str, method: str) -> str:
    """'k/n' attention layers `method` patched on timm model `name` built on the meta device (counts only: a meta model
    runs no forward), or its one-line refusal."""
    import timm

    from condattn import apply_conditioning, remove_conditioning

    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = timm.create_model(name, pretrained=False)
        try:
            rep = apply_conditioning(model, method)
        except ValueError as e:  # the reason; where the first line only counts, the first unmatched class's why
            lines = str(e).splitlines()
            why = lines[0].partition(": ")[2]
            if why.endswith(":") and len(lines) > 1:
                why = f"{why[:-1]}; {lines[1].strip()}"
            return "refused: " + why.replace("|", "/")
        except Exception as e:  # noqa: BLE001 (recorded in the table)
            return f"error: {type(e).__name__}"
    remove_conditioning(model)
    n = rep.layers(method)
    return f"{n}/{n + len({e.module for e in rep.skipped})}"


def _timm_rivals(rows) -> list[str]:
    """The same four methods on each timm family's model of the SCA table (meta device)."""
    cells = [(r.family, r.model, [_timm_reach(r.model, m) for m in RIVALS]) for r in rows]
    full = {m: sum(bool(re.fullmatch(r"(\d+)/\1", c[2][i])) and c[2][i] != "0/0" for c in cells)
            for i, m in enumerate(RIVALS)}
    out = ["### On timm", "",
           "The same four methods on each timm family's model above, built on the meta device (patched layers of those "
           "found, counted; no forward), or the one-line refusal.", "",
           "- " + "; ".join(f"{m}: {full[m]} of {len(cells)} families on every layer" for m in RIVALS), "",
           "| family | model | " + " | ".join(RIVALS) + " |", "|---|---|" + "---|" * len(RIVALS)]
    out += [f"| {fam} | `{model}` | " + " | ".join(c) + " |" for fam, model, c in cells]
    return [*out, ""]


def write_timm_record(path: Path) -> dict[str, str | None]:
    """tests/fixtures/timm_smallest.json: each timm model module's smallest model under the installed timm (None: none
    builds on the meta device), so that tests/test_coverage.py builds one model per family instead of twelve."""
    import timm

    chosen = {}
    for mod in sorted(timm.list_modules()):
        pick = smallest_timm_model(mod)
        chosen[mod] = None if pick is None else pick[0]
    path.write_text(json.dumps({"timm": timm.__version__, "smallest": chosen}, indent=1) + "\n")
    print(f"wrote {path}")
    return chosen


def main() -> None:
    root = Path(__file__).resolve().parents[1]
    chosen = write_timm_record(root / "tests" / "fixtures" / "timm_smallest.json")
    t, h = timm_rows(chosen=chosen), transformers_rows()
    lines = ["# Coverage: which models each method patches", "",
             "Generated by `scripts/coverage_table.py` (tests/test_coverage.py asserts it). timm: the smallest of the "
             "first 12 models of each model module, counted on the meta device; transformers: tiny random configs, "
             "run on CPU (output changed, then restored bit-exactly by `remove_conditioning`).", "",
             f"- timm: {sum(r.full for r in t)} of {len(t)} attention families on every attention layer, "
             f"{sum(r.patched > 0 for r in t)} on at least one; CET token site in {sum(r.tokens for r in t)}.",
             f"- transformers: {sum(r.full for r in h)} of {len(h)} types on every attention layer.", "",
             *_not_covered(t), markdown(t + h), "", *_rivals(), *_timm_rivals(t)]
    out = root / "docs" / "coverage.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
