"""`python -m condattn.compare RUN_OR_GROUP...`: runs or groups of seeds side by side, from their summaries.

Each argument is one group:
- a run directory (holding summary.json), or a directory of run directories;
- a glob (quote it): `'runs/smoke/table4_lra_listops_none_smoke_s*'`;
- a run-name prefix looked up under the runs root (and its scale folders): `table4_lra_listops_none_smoke`;
- `wandb:ENTITY/PROJECT/NAME_PREFIX`: the wandb runs (of a synced or online project) whose name starts with
  the prefix, read through the wandb public API (summary metrics, `condattn/steps`, `condattn/wall_time_s`
  and the logged history), so runs from several clusters can be compared without copying run directories.

Prints, per group, the final metric as mean ± std over its finished runs (± n/a for a single run), the difference
to the first group with a 95% confidence interval (Welch's t interval, or a bootstrap without scipy; the same
statistics code as the tables), steps and wall time; writes one figure overlaying the groups' validation curves
(metrics.jsonl), the mean per group bold with each run faint, and the table's metric as a marker (mean ± std) at
each group's last step, so the figure shows the number the table reports even when that metric (test accuracy)
has no per-step curve.

Runs are pooled as seeds only when their science configs (engine/identity.py) agree in everything but the seed: a
prefix over λ variants gives one group per config, labelled with the readable difference (`[lam=5]`), with a
warning naming the differing keys; a variant run is listed by its seed and variant (`s0-lr2x`, `s0-<8 hex>`).

A group whose runs belong to several tasks (a glob such as 'runs/smoke/table4_*') is split per task, with a
warning, and each task gets its own table and figure: runs of different tasks are never averaged together.
"""

from __future__ import annotations

import argparse
import glob as globlib
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .reporting.fmt import fmt_ci, fmt_p, verdict_text
from .runs import SEED_VARIANT, RunRecord
from .stats import diff_ci, mean_std, verdicts
from .table.store import exploratory_root


@dataclass
class Group:
    label: str
    runs: list[Path] = field(default_factory=list)  # finished runs (wandb runs: Path(run name))
    summaries: list[dict] = field(default_factory=list)
    unfinished: list[Path] = field(default_factory=list)
    histories: list[list[dict]] = field(default_factory=list)  # metrics.jsonl rows of each finished run


def _word(t) -> str:
    return verdict_text(t.outcome, t.mde_printed)


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


def task_of(summary: dict) -> str | None:
    """The task a run trained (its resolved config's task.name); None when the summary has no config (wandb)."""
    task = ((summary.get("config") or {}).get("task") or {}).get("name")
    return None if task is None else str(task)


def split_by_task(groups: list[Group]) -> tuple[list[tuple[str | None, list[Group]]], list[str]]:
    """[(task, groups)] and warnings. Groups stay as given (one table) unless some group's runs belong to several
    tasks: then every group is split into one subgroup per task ("label [task]") and each task is a table of its own
    (the first subgroup of a task is its reference)."""
    warnings = []
    for g in groups:
        tasks = sorted({str(task_of(s)) for s in g.summaries})
        if len(tasks) > 1:
            counts = ", ".join(f"{t} ({sum(str(task_of(s)) == t for s in g.summaries)})" for t in tasks)
            warnings.append(f"{g.label!r} matches runs of {len(tasks)} tasks: {counts}; compared per task, "
                            "not averaged into one group")
    if not warnings:
        return [(None, groups)], []
    by_task: dict[str | None, list[Group]] = {}
    for g in groups:
        parts: dict[str | None, Group] = {}
        for run, summary, hist in zip(g.runs, g.summaries, g.histories):
            t = task_of(summary)
            sub = parts.setdefault(t, Group(f"{g.label} [{t}]"))
            sub.runs.append(run)
            sub.summaries.append(summary)
            sub.histories.append(hist)
        if len(parts) == 1:  # a group of one task keeps its label
            (t, sub), = parts.items()
            sub.label = g.label
        for t, sub in parts.items():
            by_task.setdefault(t, []).append(sub)
    return list(by_task.items()), warnings


def _science_key(summary: dict) -> str | None:
    """The run's science config without its seed (engine/identity.py), as a key; None without a recorded config."""
    from .engine.identity import science_config

    cfg = summary.get("config")
    if not isinstance(cfg, dict):
        return None
    sci = science_config(cfg)
    sci.pop("seed", None)
    return json.dumps(sci, sort_keys=True)


def _flat(d: object, prefix: str = "") -> dict:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out: dict = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out


def _readable(keys: list[str], values: dict) -> str:
    """'lam=5, identity=per_head': the differing keys by their last part (the full key where two last parts clash)."""
    short = [k.rsplit(".", 1)[-1] for k in keys]
    shown = [f"{s if short.count(s) == 1 else k}={values.get(k, '–')}" for s, k in zip(short, keys)]
    return ", ".join(shown[:3]) + (f" +{len(shown) - 3} more" if len(shown) > 3 else "")


def split_by_config(groups: list[Group]) -> tuple[list[Group], list[str]]:
    """Runs are pooled as seeds only when their science configs agree in everything but the seed: a group whose runs
    hold several configs (a prefix over λ variants) becomes one group per config, labelled with the readable
    difference ("label [lam=5]"), with a warning naming the keys that differ."""
    out, warnings = [], []
    for g in groups:
        parts: dict[str | None, Group] = {}
        for run, summary, hist in zip(g.runs, g.summaries, g.histories):
            sub = parts.setdefault(_science_key(summary), Group(g.label))
            sub.runs.append(run)
            sub.summaries.append(summary)
            sub.histories.append(hist)
        if len(parts) <= 1:
            out.append(g)
            continue
        flat = {k: _flat(json.loads(k)) if k else {} for k in parts}
        keys = sorted({k for f in flat.values() for k in f
                       if len({json.dumps(x.get(k), default=str) for x in flat.values()}) > 1})
        for k, sub in parts.items():
            sub.label = f"{g.label} [{_readable(keys, flat[k]) if k else 'no recorded config'}]"
            out.append(sub)
        out[-1].unfinished = g.unfinished
        warnings.append(f"{g.label!r} matches runs of {len(parts)} configs that differ in {', '.join(keys) or '?'}; "
                        "compared as separate groups, not pooled as seeds")
    return out, warnings


def _default_metric(groups: list[Group]) -> str:
    sums = [s for g in groups for s in g.summaries]
    for key in ("test_acc", "val_acc"):
        if sums and all(key in s["metrics"] for s in sums):
            return key
    return next(iter(sums[0]["metrics"])) if sums else "val_acc"


def _seed_tag(d: Path) -> str:
    """'s0', or 's0-lr2x', 's0-1a2b3c4d' for a variant run (runs.VARIANT; the group label carries the readable
    difference)."""
    m = re.search(rf"_s({SEED_VARIANT.pattern})$", d.name)
    return f"s{m.group(1)}" if m else d.name


def table(groups: list[Group], metric: str, level: float = 0.95) -> tuple[str, list[dict]]:
    """Each group beside the first: Δ with its Welch interval, and the tests the tables use: Welch's p, Holm-adjusted
    over the groups set beside the first when there are more than one, an exact permutation p and the verdict that
    follows the adjusted p."""
    scale = 100.0 if metric.endswith("acc") else 1.0
    unit = " (×100)" if scale == 100.0 else ""
    holm = len(groups) > 2
    head = ["group", "n", f"{metric}{unit}", f"Δ vs {groups[0].label} [{int(level * 100)}% CI]",
            f"p: Welch / {'Holm' if holm else 'adjusted (one test)'} / permutation", "verdict", "steps",
            "wall time / run", "runs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = []
    ref = [scale * float(s["metrics"][metric]) for s in groups[0].summaries if metric in s["metrics"]]
    vals_of = [[scale * float(s["metrics"][metric]) for s in g.summaries if metric in s["metrics"]] for g in groups]
    higher = not metric.endswith(("loss", "ppl", "perplexity"))
    tests = verdicts(ref, [(i, v, "primary") for i, v in enumerate(vals_of) if i > 0], higher)
    methods = set()
    for i, g in enumerate(groups):
        vals = vals_of[i]
        steps = sorted({int(s.get("steps", 0)) for s in g.summaries})
        walls = [float(s.get("wall_time_s", 0.0)) for s in g.summaries]
        ms = mean_std(vals) if vals else None
        t = tests.get(i)
        ci = diff_ci(ref, vals, level) if i > 0 else None
        if ci:
            methods.add(ci.method)
        if i == 0:
            delta = "–"
        elif ci:
            delta = fmt_ci(ci.diff, ci.low, ci.high)
        elif vals and ref:
            delta = f"{ms[0] - mean_std(ref)[0]:+.2f} (no CI: needs ≥ 2 runs per group)"
        else:
            delta = "–"
        spread = f"{ms[1]:.2f}" if len(vals) > 1 else "n/a"  # no spread from one run
        p = "–" if t is None or t.p is None else f"{fmt_p(t.p)} / {fmt_p(t.p_adj)} / {fmt_p(t.p_perm)}"
        cells = [
            g.label, str(len(vals)), f"{ms[0]:.2f} ± {spread}" if ms else "no finished runs", delta, p,
            _word(t) if t else "–", ",".join(map(str, steps)) or "–", f"{mean_std(walls)[0]:.0f} s" if walls else "–",
            " ".join(_seed_tag(d) for d in g.runs) + (f" (+{len(g.unfinished)} unfinished)" if g.unfinished else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
        rows.append({"group": g.label, "n": len(vals), "mean": ms[0] if ms else None,
                     "std": ms[1] if len(vals) > 1 else None,
                     "diff": ci.diff if ci else None, "ci_low": ci.low if ci else None,
                     "ci_high": ci.high if ci else None, "p_welch": t.p if t else None,
                     "p_adjusted": t.p_adj if t else None, "p_permutation": t.p_perm if t else None,
                     "verdict": _word(t) if t else None, "values": vals, "steps": steps, "wall_time_s": walls})
    how = {"welch-t": "Welch t interval", "bootstrap": "bootstrap percentile interval (scipy not installed)"}
    kinds = ", ".join(how[m] for m in sorted(methods)) or "none computed"
    which = f"Holm-adjusted p over the {len(groups) - 1} groups set beside the first" if holm else "p"
    note = (f"Δ: mean difference to the first group with its {int(level * 100)}% CI ({kinds}). The verdict follows "
            f"the {which} (< 0.05), never the interval alone; 'no difference detected' gives the MDE at 80% power.")
    return "\n".join(lines) + "\n\n" + note + "\n", rows


def _mean_curve(curves: list[dict]) -> tuple[list, list]:
    """The mean of the runs' curves on the union of their steps, each run linearly interpolated, over the steps
    every run covers (runs evaluated at different steps still get a mean); empty when they do not overlap."""
    import numpy as np

    lo, hi = max(min(c) for c in curves), min(max(c) for c in curves)
    grid = sorted({x for c in curves for x in c if lo <= x <= hi})
    if not grid:
        return [], []
    ys = [np.interp(grid, sorted(c), [c[x] for x in sorted(c)]) for c in curves]
    return grid, list(np.mean(ys, axis=0))


def plot(groups: list[Group], out: Path, split: str = "val", key: str = "acc",
         metric: str | None = None) -> Path | None:
    """Per group: each run's split/key curve faint, their mean bold; and, when `metric` (the table's summary metric)
    is given, its mean ± std over the group's runs as a marker at the group's last step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    drew = False
    pct = key == "acc"
    for i, g in enumerate(groups):
        curves = []
        for hist in g.histories:
            pts = {r["step"]: r[key] for r in hist if r.get("split") == split and key in r}
            if pts:
                curves.append(pts)
                xs = sorted(pts)
                ax.plot(xs, [100 * pts[x] if pct else pts[x] for x in xs], color=f"C{i}", alpha=0.25, lw=1)
        if not curves:
            continue
        drew = True
        xs, mean = _mean_curve(curves)
        ax.plot(xs, [100 * m if pct else m for m in mean], color=f"C{i}", lw=2.5,
                label=f"{g.label} (mean of {len(curves)})")
        vals = [float(s["metrics"][metric]) for s in g.summaries if metric and metric in s["metrics"]]
        if vals:
            m, sd = mean_std(vals)
            f = 100 if metric.endswith("acc") else 1
            ax.errorbar([max(max(c) for c in curves)], [f * m], yerr=[f * sd] if len(vals) > 1 else None,
                        color=f"C{i}", marker="D", ms=6, capsize=3, lw=1.5, zorder=3)
    if not drew:
        plt.close(fig)
        return None
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"{split} {key}" + (" (%)" if pct else ""))
    title = f"{split} {key} per step: group mean (bold), each run (faint)"
    if metric:
        title += (f"\n◆ the table's {metric}" + (" (×100)" if metric.endswith("acc") else "")
                  + ", mean ± std, drawn at each group's last step")
    ax.set_title(title, fontsize=9)
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
    p.add_argument("--out", help="figure path (default results/exploratory/compare/<groups>.png: git ignores it)")
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
    tables, warnings = split_by_task(groups)
    config_warnings = []
    for i, (task, task_groups) in enumerate(tables):
        split_groups, w = split_by_config(task_groups)
        tables[i], config_warnings = (task, split_groups), config_warnings + w
    for w in warnings + config_warnings:
        print(f"[compare] warning: {w}", file=sys.stderr)
    split, _, key = args.curve.partition(":")
    digest = hashlib.sha1("\n".join(args.groups).encode()).hexdigest()[:8]
    out = Path(args.out) if args.out else exploratory_root("results") / "compare" / f"compare_{digest}.png"
    for task, task_groups in tables:
        if len(tables) > 1:
            print(f"### task {task}\n")
        md, _ = table(task_groups, metric, args.level)
        print(md)
        path = out if len(tables) == 1 else out.with_name(f"{out.stem}_{task}{out.suffix}")
        fig = plot(task_groups, path, split or "val", key or "acc", metric)
        print(f"[compare] figure: {fig} ({split or 'val'} {key or 'acc'} curves; markers: the table's {metric})" if fig
              else f"[compare] no {args.curve} rows in metrics.jsonl: no figure")
    for g in groups:
        for d in g.unfinished:
            print(f"[compare] {g.label}: {d} has no finished summary; left out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
