"""`python -m condattn.compare RUN_OR_GROUP...`: runs or groups of seeds side by side, from their summaries.

Each argument is one group:
- a run directory (holding summary.json), or a directory of run directories;
- a glob (quote it): `'runs/smoke/table4_lra_listops_none_smoke_s*'`;
- a run-name prefix looked up under the runs root (and its scale folders): `table4_lra_listops_none_smoke`;
- `wandb:ENTITY/PROJECT/NAME_PREFIX`: the wandb runs (of a synced or online project) whose name starts with
  the prefix, read through the wandb public API (summary metrics, `condattn/steps`, `condattn/wall_time_s`
  and the logged history), so runs from several clusters can be compared without copying run directories.

Prints, per group, the final metric as mean ± std over its finished runs, the difference to the first group
with a 95% confidence interval (Welch's t interval, or a bootstrap without scipy; the same statistics code
as the tables), steps and wall time; writes one figure overlaying the groups' validation curves
(metrics.jsonl), mean per group with each run faint.
"""

from __future__ import annotations

import argparse
import glob as globlib
import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .reporting.stats import diff_ci, mean_std
from .runs import RunRecord


@dataclass
class Group:
    label: str
    runs: list[Path] = field(default_factory=list)  # finished runs (wandb runs: Path(run name))
    summaries: list[dict] = field(default_factory=list)
    unfinished: list[Path] = field(default_factory=list)
    histories: list[list[dict]] = field(default_factory=list)  # metrics.jsonl rows of each finished run


def _is_run(p: Path) -> bool:
    return RunRecord(p).looks_like_run()


def resolve(arg: str, runs_root: Path) -> list[Path]:
    """Run directories an argument names (sorted); empty when nothing matches."""
    p = Path(arg)
    if _is_run(p):
        return [p]
    if p.is_dir():
        return sorted(d for d in p.iterdir() if _is_run(d))
    if any(ch in arg for ch in "*?["):
        for pattern in (arg, str(runs_root / arg), str(runs_root / "*" / arg)):
            hits = sorted(Path(h) for h in globlib.glob(pattern) if _is_run(Path(h)))
            if hits:
                return hits
        return []
    for base in (runs_root, *sorted(d for d in runs_root.glob("*") if d.is_dir())):
        if _is_run(base / arg):
            return [base / arg]
    hits = sorted({d for base in (runs_root, *runs_root.glob("*")) if base.is_dir()
                   for d in base.glob(f"{globlib.escape(arg)}*") if _is_run(d)})
    return hits


def load_group(arg: str, runs_root: Path) -> Group:
    if arg.startswith(WANDB_PREFIX):
        return load_wandb_group(arg)
    label = Path(arg.rstrip("/")).name or arg
    g = Group(label)
    for d in resolve(arg, runs_root):
        record = RunRecord(d)
        s = record.summary
        if s is not None and isinstance(s["metrics"], dict):
            g.runs.append(d)
            g.summaries.append(s)
            g.histories.append(record.metrics_rows())
        else:
            g.unfinished.append(d)
    return g


WANDB_PREFIX = "wandb:"


def load_wandb_group(arg: str, api=None) -> Group:
    """`wandb:ENTITY/PROJECT/NAME_PREFIX` -> the runs of that project whose display name starts with the prefix.

    A run counts as finished when wandb says so and it carries the metrics the trainer writes into the run
    summary at the end (RunLogger.finish); its history rows `split/key` become metrics.jsonl-style rows."""
    spec = arg[len(WANDB_PREFIX):].strip("/")
    parts = spec.split("/")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"wandb group {arg!r} must look like wandb:ENTITY/PROJECT/NAME_PREFIX")
    entity, project, prefix = parts
    if api is None:
        import wandb

        api = wandb.Api(timeout=20)
    g = Group(prefix)
    runs = api.runs(f"{entity}/{project}", filters={"display_name": {"$regex": f"^{re.escape(prefix)}"}})
    for run in sorted(runs, key=lambda r: r.name):
        summary = {k: v for k, v in dict(run.summary).items() if not k.startswith("_")}
        metrics = {k: v for k, v in summary.items() if "/" not in k and isinstance(v, (int, float))}
        if run.state != "finished" or not metrics:
            g.unfinished.append(Path(run.name))
            continue
        g.runs.append(Path(run.name))
        g.summaries.append({"status": "finished", "metrics": metrics, "run_dir": run.url,
                            "steps": summary.get("condattn/steps", 0),
                            "wall_time_s": summary.get("condattn/wall_time_s", 0.0)})
        rows = []
        for h in run.scan_history():
            step = h.get("_step")
            by_split: dict[str, dict] = {}
            for k, v in h.items():
                split, sep, key = k.partition("/")
                if sep and split != "condattn" and v is not None:
                    by_split.setdefault(split, {})[key] = v
            rows += [{"step": step, "split": sp, **vals} for sp, vals in by_split.items()]
        g.histories.append(rows)
    return g


def _default_metric(groups: list[Group]) -> str:
    sums = [s for g in groups for s in g.summaries]
    for key in ("test_acc", "val_acc"):
        if sums and all(key in s["metrics"] for s in sums):
            return key
    return next(iter(sums[0]["metrics"])) if sums else "val_acc"


def _seed_tag(d: Path) -> str:
    m = re.search(r"_s(\d+)$", d.name)
    return f"s{m.group(1)}" if m else d.name


def table(groups: list[Group], metric: str, level: float = 0.95) -> tuple[str, list[dict]]:
    scale = 100.0 if metric.endswith("acc") else 1.0
    unit = " (×100)" if scale == 100.0 else ""
    head = ["group", "n", f"{metric}{unit}", f"Δ vs {groups[0].label} [{int(level * 100)}% CI]", "steps",
            "wall time / run", "runs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = []
    ref = [scale * float(s["metrics"][metric]) for s in groups[0].summaries if metric in s["metrics"]]
    methods = set()
    for i, g in enumerate(groups):
        vals = [scale * float(s["metrics"][metric]) for s in g.summaries if metric in s["metrics"]]
        steps = sorted({int(s.get("steps", 0)) for s in g.summaries})
        walls = [float(s.get("wall_time_s", 0.0)) for s in g.summaries]
        ms = mean_std(vals) if vals else None
        ci = diff_ci(ref, vals, level) if i > 0 else None
        if ci:
            methods.add(ci.method)
        if i == 0:
            delta = "–"
        elif ci:
            delta = ci.text()
        elif vals and ref:
            delta = f"{ms[0] - mean_std(ref)[0]:+.2f} (no CI: needs ≥ 2 runs per group)"
        else:
            delta = "–"
        cells = [
            g.label, str(len(vals)), f"{ms[0]:.2f} ± {ms[1]:.2f}" if ms else "no finished runs", delta,
            ",".join(map(str, steps)) or "–", f"{mean_std(walls)[0]:.0f} s" if walls else "–",
            " ".join(_seed_tag(d) for d in g.runs) + (f" (+{len(g.unfinished)} unfinished)" if g.unfinished else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
        rows.append({"group": g.label, "n": len(vals), "mean": ms[0] if ms else None, "std": ms[1] if ms else None,
                     "diff": ci.diff if ci else None, "ci_low": ci.low if ci else None,
                     "ci_high": ci.high if ci else None, "values": vals, "steps": steps, "wall_time_s": walls})
    how = {"welch-t": "Welch t interval", "bootstrap": "bootstrap percentile interval (scipy not installed)"}
    kinds = ", ".join(how[m] for m in sorted(methods)) or "none computed"
    note = f"Δ: mean difference to the first group with its {int(level * 100)}% CI ({kinds})."
    return "\n".join(lines) + "\n\n" + note + "\n", rows


def plot(groups: list[Group], out: Path, split: str = "val", key: str = "acc") -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    drew = False
    for i, g in enumerate(groups):
        curves = []
        for hist in g.histories:
            pts = {r["step"]: r[key] for r in hist if r.get("split") == split and key in r}
            if pts:
                curves.append(pts)
                xs = sorted(pts)
                ax.plot(xs, [100 * pts[x] if key == "acc" else pts[x] for x in xs], color=f"C{i}", alpha=0.25, lw=1)
        if curves:
            common = sorted(set.intersection(*(set(c) for c in curves)))
            mean = [mean_std([c[x] for c in curves])[0] for x in common]
            ax.plot(common, [100 * m if key == "acc" else m for m in mean], color=f"C{i}", lw=2,
                    label=f"{g.label} (n={len(curves)})")
            drew = True
    if not drew:
        plt.close(fig)
        return None
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"{split} {key}" + (" (%)" if key == "acc" else ""))
    ax.set_title(f"{split} {key}: mean per group (bold), each run (faint)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m condattn.compare", description=__doc__.splitlines()[0])
    p.add_argument("groups", nargs="+", metavar="RUN_OR_GROUP", help="run dir, directory of runs, quoted glob, or "
                   "run-name prefix under the runs root; the first group is the reference")
    p.add_argument("--metric", help="summary.json metrics key (default: test_acc when every run has it, else val_acc)")
    p.add_argument("--runs-root", default=None, help="where prefixes are looked up (default: $CONDATTN_RUNS or runs)")
    p.add_argument("--curve", default="val:acc", help="split:key of the metrics.jsonl rows to plot (default val:acc)")
    p.add_argument("--out", help="figure path (default results/compare/<groups>.png)")
    p.add_argument("--level", type=float, default=0.95, help="confidence level of the difference interval")
    args = p.parse_args(argv)

    import os

    runs_root = Path(args.runs_root or os.environ.get("CONDATTN_RUNS", "runs"))
    try:
        groups = [load_group(a, runs_root) for a in args.groups]
    except ValueError as e:
        print(f"[compare] {e}", file=sys.stderr)
        return 2
    except Exception as e:  # wandb unreachable, unknown project, missing API key
        if not any(a.startswith(WANDB_PREFIX) for a in args.groups):
            raise
        print(f"[compare] could not read the wandb groups ({type(e).__name__}: {e}); check WANDB_API_KEY, the "
              f"entity/project names and the network, or compare local run directories instead", file=sys.stderr)
        return 2
    empty = [a for a, g in zip(args.groups, groups) if not g.runs and not g.unfinished]
    if empty:
        print(f"[compare] no run matches {', '.join(repr(a) for a in empty)} (looked as a path, a glob, and a run-name "
              f"prefix under {runs_root}/ and {runs_root}/*/)", file=sys.stderr)
        return 2
    if not any(g.summaries for g in groups):
        print("[compare] none of the matched runs has finished (no valid summary.json)", file=sys.stderr)
        return 2
    metric = args.metric or _default_metric(groups)
    missing = [g.label for g in groups for s in g.summaries if metric not in s["metrics"]]
    if missing:
        known = sorted({k for g in groups for s in g.summaries for k in s["metrics"]})
        print(f"[compare] metric {metric!r} is missing in runs of {', '.join(sorted(set(missing)))}; "
              f"known metrics: {', '.join(known)}", file=sys.stderr)
        return 2
    md, _ = table(groups, metric, args.level)
    print(md)
    for g in groups:
        for d in g.unfinished:
            print(f"[compare] {g.label}: {d} has no finished summary; left out")
    split, _, key = args.curve.partition(":")
    digest = hashlib.sha1("\n".join(args.groups).encode()).hexdigest()[:8]
    out = Path(args.out) if args.out else Path("results") / "compare" / f"compare_{digest}.png"
    fig = plot(groups, out, split or "val", key or "acc")
    print(f"[compare] figure: {fig}" if fig else f"[compare] no {args.curve} rows in metrics.jsonl: no figure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
