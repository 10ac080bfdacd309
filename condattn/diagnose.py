"""`python -m condattn.diagnose [--method M] [--batch B] [--out DIR] [--jacobian] [hydra overrides...]`

Measures one model the Hydra configs describe (the same config `python -m condattn.train` runs), baseline and
conditioned side by side. The model is built ONCE (seeded as the trainer seeds it),
deep-copied, and `none` / the method applied to the two copies, so both arms have identical stored weights.
On the first `--batch` validation samples it measures per layer κ(W_Q/W_K/W_V) and σ_min(W_Q) (effective
weights, W + C under SCA), κ(X) of each block's input, attention entropy and max probability, the share of queries
whose attention argmax is themselves and the class token's self-attention (one forward; with the spread of the final
pooled feature across the batch), the embedding's gradient norm,
and ‖∇W_Q‖, ‖∇W_K‖ after one backward of the task loss (eval mode: no dropout, so both arms compute the
same function of the same batch). `--jacobian` adds κ(J) of the first attention layer's head 0, with that layer's own
attention formula (condattn.diagnostics.jacobian_kappa: token softmax, XCiT's cross-covariance attention, ...).

Prints a table ("baseline → conditioned" per cell) under a provenance header, and writes
`<out>/<model>_<method>_<scale>.{png,json}` (default out: `<paths.results>/exploratory/diagnose`, which git ignores).
Model-specific code lives in the registries (models, tasks, conditioning layouts), not here.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from .conditioning.forms import FORMS
from .conditioning.spec import BASELINE
from .diagnostics import layer_jacobian
from .diagnostics.layer_jacobian import EXACT_MAX_ENTRIES
from .table.store import exploratory_root

DEFAULT_METHOD = "spectral"  # diagnosed when neither --method nor conditioning=... names one: the SCA paper's
ARROW = " → "
COLUMNS = (  # (header, flat diagnostics key; i = layer / block index)
    ("κ(W_Q)", "kappa_wq/l{i}"),
    ("κ(W_K)", "kappa_wk/l{i}"),
    ("κ(W_V)", "kappa_wv/l{i}"),
    ("σ_min(W_Q)", "sigma_min_wq/l{i}"),
    ("κ(X in)", "kappa_x/b{i}"),
    ("entropy", "entropy/l{i}"),
    ("max prob", "maxprob/l{i}"),
    ("self-argmax", "self_argmax/l{i}"),
    ("cls→cls", "cls_self/l{i}"),
    ("‖∇W_Q‖", "gradnorm_wq/l{i}"),
    ("‖∇W_K‖", "gradnorm_wk/l{i}"),
)


class DiagnoseError(Exception):
    """A user error (bad method, option or data path): printed as one message, exit code 2."""


def harness():
    """condattn.config and condattn.checks, which a configured model needs (Hydra, OmegaConf: the `harness` extra);
    `--model MODULE:CALLABLE` needs torch alone and never imports them."""
    try:
        from . import checks, config
    except ModuleNotFoundError as e:
        raise DiagnoseError(f"a configured model (Hydra overrides) needs the harness, and {e.name} is not installed: "
                            "pip install 'condattn[harness]'; your own model needs torch alone: --model "
                            "MODULE:CALLABLE") from e
    return config, checks


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m condattn.diagnose",
        description="Per-layer κ / entropy / gradient table of a configured model, baseline → conditioned.",
    )
    p.add_argument("--method", help="conditioning method (default: the conditioning=... override, else "
                   f"{DEFAULT_METHOD})")
    p.add_argument("--batch", type=int, default=4, help="validation samples measured (default 4)")
    p.add_argument("--out", help="output directory (default: <paths.results>/exploratory/diagnose, ignored by git)")
    p.add_argument("--jacobian", action="store_true", help="also κ(J) of the first attention layer's head 0")
    p.add_argument(
        "--jacobian-tokens", type=int, default=None, metavar="N",
        help=f"use at most the first N tokens for κ(J) (default: all that keep J ≤ {EXACT_MAX_ENTRIES:.0e} entries)",
    )
    p.add_argument("--model", metavar="MODULE:CALLABLE", help="your own model: CALLABLE() returns (model, batch) or "
                   "(model, batch, loss(model, batch)), run as model(**batch) for a dict, else model(batch); "
                   "overrides are then conditioning.KEY=VALUE options only")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m condattn.train")
    args = p.parse_intermixed_args(argv)
    if args.batch < 1:
        p.error("--batch must be at least 1")
    if args.jacobian_tokens is not None and args.jacobian_tokens < 1:
        p.error("--jacobian-tokens must be at least 1")
    return args


def with_method(method: str | None, overrides: list[str]) -> list[str]:
    """The overrides with the conditioning method made explicit (conditioning=spectral when none is given)."""
    given = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+~") == "conditioning"]
    if method is None:
        return overrides if given else [f"conditioning={DEFAULT_METHOD}", *overrides]
    if given:
        if given[-1] != method:
            raise DiagnoseError(f"--method {method} contradicts the override conditioning={given[-1]}")
        return overrides
    if (harness()[0].CONFIG_DIR / "conditioning" / f"{method}.yaml").is_file():
        return [f"conditioning={method}", *overrides]
    # not a config option: let apply_conditioning's check name the valid methods
    return [*overrides, f"conditioning.method={method}"]


def _first(ds, n: int) -> dict[str, torch.Tensor]:
    items = [ds[i] for i in range(min(n, len(ds)))]
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}


def measure(model: torch.nn.Module, task, batch: dict[str, torch.Tensor]) -> dict:
    """cheap_diagnostics (one forward) + W_Q/W_K/W_V gradient norms after one backward of the task loss."""
    from .diagnostics import cheap_diagnostics, grad_diagnostics, qkv_grad_norms

    out = cheap_diagnostics(model, task.forward, batch, mask=batch.get("attention_mask"))
    model.zero_grad(set_to_none=True)
    loss, _ = task.loss(model, batch)
    loss.backward()
    out["grads"] = qkv_grad_norms(model)
    out["flat"].update(grad_diagnostics(model))
    out["loss"] = float(loss.detach())
    model.zero_grad(set_to_none=True)
    return out


def head_inputs(model: torch.nn.Module, task, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list, Any]:
    """condattn.diagnostics.head_inputs for a task's forward and its batch's padding mask."""
    try:
        return layer_jacobian.head_inputs(model, task.forward, batch, batch.get("attention_mask"))
    except ValueError as e:
        raise DiagnoseError(f"--jacobian: {e}") from e


def jacobian_kappa(model: torch.nn.Module, task, batch: dict[str, torch.Tensor], max_tokens: int | None,
                   iters: int = 300, exact_max_entries: int = EXACT_MAX_ENTRIES) -> dict:
    """condattn.diagnostics.jacobian_kappa (κ(J) of head 0 of the first attention layer, with its own formula) for a
    task's forward and its batch's padding mask."""
    try:
        return layer_jacobian.jacobian_kappa(model, task.forward, batch, batch.get("attention_mask"), max_tokens,
                                             iters=iters, exact_max_entries=exact_max_entries)
    except ValueError as e:  # e.g. no attention layer matches a registered layout: a user error, exit code 2
        raise DiagnoseError(f"--jacobian: {e}") from e


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    return f"{v:.4g}"


def table(flat: tuple[dict, dict], rows: int) -> list[str]:
    header = ["layer", *(h for h, _ in COLUMNS)]
    cells = [
        [str(i), *(_fmt(flat[0].get(k.format(i=i))) + ARROW + _fmt(flat[1].get(k.format(i=i))) for _, k in COLUMNS)]
        for i in range(rows)
    ]
    width = [max(len(r[j]) for r in [header, *cells]) for j in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, width))  # noqa: E731
    return [line(header), "  ".join("-" * w for w in width), *(line(r) for r in cells)]


def plot(path: Path, arms: dict[str, dict], title: str, footer: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.8))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    styles = {"baseline": "-", "conditioned": "--"}
    for arm, nested in arms.items():
        ls = styles[arm]
        for role, color in zip("qkv", ("C0", "C1", "C2")):
            y = [float("nan") if w[role] is None else w[role]["kappa"] for w in nested["weights"]]  # absent: a gap
            axes[0].plot(range(len(y)), y, ls, marker="o", color=color, label=f"W_{role.upper()} {arm}")
        y = [b["kappa_mean"] for b in nested["blocks"]]
        axes[1].plot(range(len(y)), y, ls, marker="o", color="C3", label=f"{arm} (mean)")
        y = [b["kappa_max"] for b in nested["blocks"]]
        axes[1].plot(range(len(y)), y, ls, marker="^", color="C4", alpha=0.6, label=f"{arm} (max)")
        y = [float("nan") if a["entropy"] is None else a["entropy"] for a in nested["attention"]]  # absent: a gap
        axes[2].plot(range(len(y)), y, ls, marker="o", color="C5", label=arm)
    uni = [float("nan") if a["entropy_uniform"] is None else a["entropy_uniform"]
           for a in arms["baseline"]["attention"]]
    axes[2].plot(range(len(uni)), uni, ":", color="grey", label="uniform attention")
    names = (("κ(W_Q), κ(W_K), κ(W_V) (effective)", "attention layer", True),
             ("κ(X) entering each block", "block", True), ("attention entropy (nats)", "attention layer", False))
    for ax, (name, xlabel, log) in zip(axes, names):
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(xlabel)
        if log:
            ax.set_yscale("log")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=11)
    fig.text(0.01, 0.01, textwrap.fill(footer, 190), fontsize=7, family="monospace", va="bottom")
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def run(cfg, batch_size: int = 4, out: str | Path | None = None, jacobian: bool = False,
        jacobian_tokens: int | None = None, argv: list[str] | None = None) -> dict:
    """Measure both arms, print the table, write the png and json; returns the json's content."""
    from accelerate.utils import set_seed

    from .conditioning import apply_conditioning
    from .conditioning.spec import conditioning_spec
    from .engine import provenance
    from .engine.setup import build_components
    from .utils.io import write_json_atomic

    try:
        spec = conditioning_spec(cfg.conditioning)  # apply_conditioning's own check, before any data or model is built
    except ValueError as e:
        raise DiagnoseError(f"ValueError: {e}") from e
    method = spec.method
    if cfg.impl.get("threads"):
        torch.set_num_threads(int(cfg.impl.threads))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    set_seed(int(cfg.seed))  # the trainer's order (engine/setup.py): seed, data, model -> the model train starts from
    try:
        data, conditioned, report, task = parts = build_components(cfg, spec, prepare=lambda m: m.to(device).eval(),
                                                                   keep_unpatched=True)
    except FileNotFoundError as e:
        raise DiagnoseError(str(e)) from e
    models = {"baseline": parts.unpatched, "conditioned": conditioned}
    apply_conditioning(models["baseline"], BASELINE)
    batch = {k: v.to(device) for k, v in _first(data.val, batch_size).items()}

    arms = {arm: measure(m, task, batch) for arm, m in models.items()}
    if jacobian:
        for arm, m in models.items():
            arms[arm]["jacobian"] = jacobian_kappa(m, task, batch, jacobian_tokens)

    hw = provenance.hardware(device, 1)
    opts = ", ".join(f"{k}={list(v) if isinstance(v, tuple) else v}" for k, v in report.options.items())
    prov = {
        "model": str(cfg.model.name), "method": method, "options": report.options, "scale": str(cfg.scale.name),
        "seed": int(cfg.seed), "batch": len(next(iter(batch.values()))), "split": "val",
        "data": {"checksum": data.checksum, **data.info}, "commit": provenance.git_commit(), "hardware": hw,
        "hardware_line": provenance.describe(hw), "versions": provenance.versions(), "argv": argv,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    method_line = f"{method}({opts})" if opts else method
    head = [
        f"condattn.diagnose: {prov['model']}, baseline (none) → {method_line}",
        f"  scale={prov['scale']} seed={prov['seed']} batch={prov['batch']} validation samples | "
        f"commit {prov['commit']} | {prov['hardware_line']}, device {device}, torch threads {torch.get_num_threads()}",
        f"  data: {data.info.get('source', '?')}",
        f"  patch: {', '.join(f'{k} ×{v}' for k, v in report.counts.items()) or 'nothing'}",
    ]
    flat = (arms["baseline"]["flat"], arms["conditioned"]["flat"])
    rows = max(len(arms["baseline"]["weights"]), len(arms["baseline"]["blocks"]))
    lines = [*head, "", *table(flat, rows), *notes(arms, report)]
    if jacobian:
        lines += ["", *jacobian_lines(arms["baseline"]["jacobian"], arms["conditioned"]["jacobian"])]

    out = Path(out) if out is not None else exploratory_root(cfg.paths.results) / "diagnose"
    stem = f"{prov['model']}_{method}_{prov['scale']}"
    png, js = out / f"{stem}.png", out / f"{stem}.json"
    result = {"provenance": prov, "patch": report.to_dict(), **arms}
    write_json_atomic(js, result)
    footer = (f"seed {prov['seed']} | batch {prov['batch']} val | commit {prov['commit']} | {prov['hardware_line']} | "
              f"data: {data.info.get('source', '?')}")
    plot(png, arms, f"{prov['model']}: baseline (solid) vs {method_line} (dashed), scale {prov['scale']}", footer)
    lines += ["", f"wrote {png}", f"wrote {js}"]
    print("\n".join(lines))
    return result


def notes(arms: dict, report) -> list[str]:
    """What the table's cells are, the saturation figures, the patch's notes and absent entropies."""
    flat = (arms["baseline"]["flat"], arms["conditioned"]["flat"])
    uniform = [_fmt(a["entropy_uniform"]) for a in arms["baseline"]["attention"]]
    return [
        "each cell: baseline → conditioned. κ(W): full H·d×D block, effective (W + λI under SCA); κ(X in): tokens "
        "entering block i, mean over samples, padding excluded;",
        f"entropy (nats; uniform = {', '.join(uniform)}) / max prob: the layer's own attention probabilities (masks, "
        "positions, biases included), mean over heads and queries; ‖∇W‖_F: one backward of the task loss, eval mode "
        f"(loss {arms['baseline']['loss']:.4g} → {arms['conditioned']['loss']:.4g}).",
        "self-argmax: share of (query, head) pairs whose largest attention weight is on the query itself; cls→cls: "
        "the class token's attention to itself (— without one).",
        "saturation: ‖∇‖ of the patch/token embedding "
        f"{_fmt(flat[0].get('gradnorm_embed'))}{ARROW}{_fmt(flat[1].get('gradnorm_embed'))}; spread of the final "
        f"pooled feature across the batch (mean ‖f − f̄‖ / mean ‖f‖; 0 = input-independent) "
        f"{_fmt(flat[0].get('feature_spread'))}{ARROW}{_fmt(flat[1].get('feature_spread'))}.",
        *(f"patch note: {n}" for n in report.notes),
        *absent_notes(arms["baseline"]["attention"]),
        *absent_weight_notes(arms["baseline"]["weights"]),
    ]


def jacobian_lines(jb: dict, jc: dict) -> list[str]:
    """The κ(J) lines of `--jacobian`: what was differentiated, how, and both arms' values."""
    how = "jacrev + float64 SVD" if jb["solver"] == "exact" else "Lanczos on J Jᵀ"
    sub = (f"SUBSAMPLED: the first {jb['tokens']} of its {jb['tokens_total']} tokens ({jb['subsampled']})"
           if jb["subsampled"] else f"all {jb['tokens']} tokens")
    form = FORMS[jb["formula"]].describe(jb)
    lines = [f"κ(J) of layer 0 ({jb['layer']}) head 0 w.r.t. (W_Q, W_K, W_V): {form}, no bias, "
             f"on sample 0, {sub}; {jb['solver']} ({how}), J {jb['J_shape'][0]}×{jb['J_shape'][1]}"]
    for arm, j in (("baseline", jb), ("conditioned", jc)):
        info = j.get("info")
        if info and not info["converged"]:
            lines.append(f"  {arm}: Lanczos not converged after {info['iterations']} steps: κ(J) is a lower bound")
        if j["kappa"] == float("inf"):
            lines.append(f"  {arm}: J Jᵀ is numerically singular, κ(J) undefined matrix-free")
    lines.append(f"  κ(J): {_fmt(jb['kappa'])}{ARROW}{_fmt(jc['kappa'])}  ({jb['seconds']}s, {jc['seconds']}s)")
    return lines


def absent_weight_notes(weights: list[dict]) -> list[str]:
    """One line per role a layer has no projection for (its κ(W) is absent, —), with the reason."""
    return [f"κ(W_{r.upper()}) — at layer {w['layer']} ({w['name']}): {why}" for w in weights
            for r, why in w.get("absent", {}).items()]


def absent_notes(attention: list[dict]) -> list[str]:
    """One line per attention layer whose entropy is absent (—), with the reason."""
    return [f"entropy — at layer {a['layer']} ({a['name']}): {a['absent']}" for a in attention if a.get("absent")]


def _override_value(text: str):
    """A `conditioning.KEY=VALUE` override's value as Hydra reads it: an int, a float (1e-3 too), true / false, null,
    a [a, b] list of those, a quoted string kept a string, else the text; with the standard library alone (`--model`
    needs torch alone)."""
    t = text.strip()
    if t.startswith("[") and t.endswith("]"):
        return [_override_value(part) for part in t[1:-1].split(",") if part.strip()]
    if t.lower() in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[t.lower()]
    for number in (int, float):
        try:
            return number(t)
        except ValueError:
            pass
    quoted = len(t) > 1 and t[0] == t[-1] and t[0] in "'\""
    return t[1:-1] if quoted else t


def run_own(spec: str, method: str, overrides: list[str], out: str | None) -> dict:
    """--model MODULE:CALLABLE: the table for the model CALLABLE() builds (collect.compare_conditioning)."""
    import importlib

    from .diagnostics import compare_conditioning
    from .utils.io import write_json_atomic

    mod, _, fn = spec.partition(":")
    bad = [o for o in overrides if not (o.startswith("conditioning.") and "=" in o)]
    if not (mod and fn) or bad:
        raise DiagnoseError(f"--model {spec} {' '.join(bad)}: give --model module:callable and only "
                            "conditioning.KEY=VALUE overrides")
    try:
        made = getattr(importlib.import_module(mod), fn)()
    except (ImportError, AttributeError) as e:
        raise DiagnoseError(f"--model {spec}: {e} (the module must be importable from the current directory)") from e
    model, batch, loss = (*made, None)[:3] if isinstance(made, tuple) else (made, None, None)
    if not isinstance(model, torch.nn.Module) or batch is None:
        raise DiagnoseError(f"--model {spec}: {fn}() must return (model, batch) or (model, batch, loss)")
    options = {k.split(".", 1)[1]: _override_value(v) for k, v in (o.split("=", 1) for o in overrides)}
    forward = (lambda m, b: m(**b)) if isinstance(batch, dict) else (lambda m, b: m(b))
    mask = batch.get("attention_mask") if isinstance(batch, dict) else None
    try:
        res = compare_conditioning(model, forward, batch, method, mask, loss, **options)
    except ValueError as e:
        raise DiagnoseError(f"ValueError: {e}") from e
    flat = (res["baseline"]["flat"], res["conditioned"]["flat"])
    rows = max(len(res["baseline"]["weights"]), len(res["baseline"]["blocks"]))
    opts = ", ".join(f"{k}={v}" for k, v in options.items())
    lines = [f"condattn.diagnose: {spec}, baseline (none) → {method}({opts})",
             f"  patch: {', '.join(f'{k} ×{v}' for k, v in res['patch']['counts'].items()) or 'nothing'}", "",
             *table(flat, rows), *absent_notes(res["baseline"]["attention"]),
             *absent_weight_notes(res["baseline"]["weights"])]
    if out:
        write_json_atomic(Path(out) / f"{fn}_{method}.json", res)
        lines.append(f"wrote {Path(out) / f'{fn}_{method}.json'}")
    print("\n".join(lines))
    return res


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.model:
        try:
            run_own(args.model, args.method or DEFAULT_METHOD, args.overrides, args.out)
        except DiagnoseError as e:
            print(f"diagnose: {e}", file=sys.stderr)
            return 2
        return 0
    try:
        config, checks = harness()
        overrides = with_method(args.method, args.overrides)
    except DiagnoseError as e:
        print(f"diagnose: {e}", file=sys.stderr)
        return 2
    try:  # train's one line: the bad override, with "did you mean" for a typo
        cfg = config.compose_cell(overrides)
    except config.ConfigError as e:
        print(f"diagnose: {e}", file=sys.stderr)
        return 2
    if why := checks.threads_problem(cfg.get("impl")):
        print(f"diagnose: {why}", file=sys.stderr)
        return 2
    try:
        run(cfg, args.batch, args.out, args.jacobian, args.jacobian_tokens, argv)
    except DiagnoseError as e:
        print(f"diagnose: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
