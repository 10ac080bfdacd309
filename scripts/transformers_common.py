"""transformers' own common model tests (`ModelTesterMixin`, tests/test_modeling_common.py) on models conditioned
with every registered method: BERT, GPT-2, Llama, RoBERTa and ViT, built from tiny configs offline.

    python scripts/transformers_common.py                        every method on the five families
    python scripts/transformers_common.py --methods none qk_norm --families bert --k init_weights

The common tests ship in transformers' source distribution (`pip download --no-binary :all: --no-deps
transformers==<the installed release>`, fetched once into .cache/transformers-tests/, gitignored); its per-model
testers and its generation and export mixins do not, so the model testers are here (a tiny config and inputs per
family) and the two mixins are empty stand-ins: generation and torch.export tests are not run. Each model class is
conditioned by a subclass of the same name whose `__init__` ends in `apply_conditioning` (so every model a test
builds is conditioned) and whose `from_pretrained` is condattn's loader (every conditioned checkpoint is loaded the
way the plain load's warning says to). A method refused on a family (CET on a causal decoder) is
listed as refused. Results: pass / fail / skip counts per family and method, each failure beyond the unconditioned
model's by name, written to results/transformers_common.md with the date, the releases and the commit.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import textwrap
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "transformers-tests"
OUT = ROOT / "results" / "transformers_common.md"
FAMILIES = ("bert", "gpt2", "llama", "roberta", "vit")
CAUSAL = ("gpt2", "llama")
TEST_DEPS = ("parameterized",)  # what test_modeling_common imports beyond the harness's venv (installed beside it)
STANDINS = {"exporters/test_export.py": "class ExportTesterMixin:  # stand-in: the sdist lacks it\n    pass\n",
            "generation/test_utils.py": "class GenerationTesterMixin:  # stand-in: the sdist lacks it\n    pass\n"}


# ---------------------------------------------------------------- the model testers (tiny configs, offline)


class Tester:
    """What ModelTesterMixin reads of a model tester: sizes, `get_config`, `prepare_config_and_inputs_for_common`."""

    batch_size, seq_length, is_training = 2, 7, True
    hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size = 32, 2, 4, 37, 99

    def __init__(self, parent, family: str):
        self.parent, self.family = parent, family
        if family == "vit":
            self.image_size, self.patch_size, self.num_channels = 16, 4, 3
            self.seq_length = (self.image_size // self.patch_size) ** 2 + 1

    def get_config(self):
        import transformers as tf

        common = dict(hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
                      num_attention_heads=self.num_attention_heads, intermediate_size=self.intermediate_size)
        if self.family == "vit":
            return tf.ViTConfig(image_size=self.image_size, patch_size=self.patch_size, num_channels=3, **common)
        if self.family == "gpt2":
            return tf.GPT2Config(vocab_size=self.vocab_size, n_embd=self.hidden_size, n_layer=self.num_hidden_layers,
                                 n_head=self.num_attention_heads, n_positions=64, bos_token_id=0, eos_token_id=0,
                                 pad_token_id=0)
        if self.family == "llama":
            return tf.LlamaConfig(vocab_size=self.vocab_size, num_key_value_heads=2, max_position_embeddings=64,
                                  pad_token_id=0, **common)
        cls = tf.BertConfig if self.family == "bert" else tf.RobertaConfig
        return cls(vocab_size=self.vocab_size, max_position_embeddings=64, type_vocab_size=2, pad_token_id=1,
                   **common)

    def prepare_config_and_inputs_for_common(self):
        import torch

        g = torch.Generator().manual_seed(0)
        if self.family == "vit":
            pixels = torch.rand(self.batch_size, 3, self.image_size, self.image_size, generator=g)
            return self.get_config(), {"pixel_values": pixels}
        ids = torch.randint(2, self.vocab_size, (self.batch_size, self.seq_length), generator=g)
        mask = torch.ones_like(ids)
        mask[0, -2:] = 0  # (a padded row)
        return self.get_config(), {"input_ids": ids, "attention_mask": mask}


def model_classes(family: str) -> tuple:
    import transformers as tf

    names = {"bert": ("BertModel", "BertForMaskedLM", "BertForSequenceClassification"),
             "gpt2": ("GPT2Model", "GPT2LMHeadModel", "GPT2ForSequenceClassification"),
             "llama": ("LlamaModel", "LlamaForCausalLM", "LlamaForSequenceClassification"),
             "roberta": ("RobertaModel", "RobertaForMaskedLM", "RobertaForSequenceClassification"),
             "vit": ("ViTModel", "ViTForImageClassification")}[family]
    return tuple(getattr(tf, n) for n in names)


def conditioned(cls, method: str):
    """A subclass of `cls`, of the same name, whose instances are conditioned with `method` when built, and whose
    `from_pretrained` is condattn's loader (`condattn.conditioning.from_pretrained`), as the plain load's warning tells
    users to load a conditioned checkpoint: the loader conditions the model while transformers builds it (then
    `__init__` finds it conditioned), before the weights, the method's included, load."""
    import contextvars

    import condattn

    inside = contextvars.ContextVar(f"condattn_common_{cls.__name__}", default=False)

    def __init__(self, config, *args, **kwargs):
        cls.__init__(self, config, *args, **kwargs)
        if method != "none" and condattn.conditioning_report(self) is None:
            condattn.apply_conditioning(self, method)

    def from_pretrained(sub, *args, **kwargs):
        if inside.get():  # (condattn's loader calls the class's own from_pretrained)
            return super(built, sub).from_pretrained(*args, **kwargs)
        token = inside.set(True)
        try:
            return condattn.conditioning.from_pretrained(sub, *args, **kwargs)
        finally:
            inside.reset(token)

    built = type(cls.__name__, (cls,), {"__init__": __init__, "from_pretrained": classmethod(from_pretrained),
                                        "__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return built


def refusal(family: str, method: str) -> str:
    """'' when `method` applies to `family`'s models, else the one-line reason it is refused."""
    try:
        conditioned(model_classes(family)[0], method)(Tester(None, family).get_config())
    except (ValueError, RuntimeError) as e:
        return str(e).splitlines()[0]
    return ""


def common_classes(mixin, generation_mixin, methods, families) -> dict:
    """The unittest classes: one per (family, method) that applies, `Test_<family>__<method>`."""
    import unittest

    out = {}
    for family in families:
        for method in methods:
            if refusal(family, method):
                continue
            bases = (mixin, generation_mixin, unittest.TestCase) if family in CAUSAL else (mixin, unittest.TestCase)
            classes = tuple(conditioned(c, method) for c in model_classes(family))
            out[f"Test_{family}__{method}"] = type(f"Test_{family}__{method}", bases, {
                "all_model_classes": classes,
                "setUp": lambda self, f=family: setattr(self, "model_tester", Tester(self, f)),
            })
    return out


# ---------------------------------------------------------------- the sources and the run


def sources(version: str) -> Path:
    """A package holding transformers' test_modeling_common.py (from its sdist) and the two stand-in mixins; the
    test-only packages it imports go to CACHE/deps (the venv is left as it is)."""
    if not (CACHE / "deps").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(CACHE / "deps"), *TEST_DEPS],
                       check=True)
    pkg = CACHE / version / "hf_tests"
    if (pkg / "test_modeling_common.py").exists():
        return pkg
    sdist = CACHE / version / f"transformers-{version}.tar.gz"
    if not sdist.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                        f"transformers=={version}", "-d", str(sdist.parent)], check=True)
    with tarfile.open(sdist) as tar:
        member = tar.getmember(f"transformers-{version}/tests/test_modeling_common.py")
        (pkg / "test_modeling_common.py").parent.mkdir(parents=True, exist_ok=True)
        (pkg / "test_modeling_common.py").write_bytes(tar.extractfile(member).read())
    for rel, text in STANDINS.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
        (pkg / rel).parent.joinpath("__init__.py").touch()
    (pkg / "__init__.py").touch()
    return pkg


def write_entry(pkg: Path, methods: list[str], families: list[str]) -> Path:
    entry = pkg / "test_condattn_common.py"
    entry.write_text(textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(ROOT / 'scripts')!r})
        from transformers_common import common_classes
        from .generation.test_utils import GenerationTesterMixin
        from .test_modeling_common import ModelTesterMixin
        globals().update(common_classes(ModelTesterMixin, GenerationTesterMixin, {methods!r}, {families!r}))
        """))
    return entry


def run_tests(entry: Path, junit: Path, k: str | None) -> float:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{CACHE / 'deps'}",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-n", "0",
           "--rootdir", str(entry.parent.parent), "-c", os.devnull, f"--junitxml={junit}", str(entry)]
    start = time.monotonic()
    subprocess.run(cmd + (["-k", k] if k else []), env=env, cwd=entry.parent.parent, check=False)
    return time.monotonic() - start


def outcomes(junit: Path) -> dict[tuple[str, str], dict[str, str]]:
    """(family, method) -> test name -> passed / failed / skipped."""
    out: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    for case in ET.parse(junit).iter("testcase"):
        family, _, method = case.get("classname", "").rpartition(".Test_")[2].partition("__")
        kinds = {c.tag for c in case}
        state = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        out[(family, method)][case.get("name", "")] = state
    return out


def commit() -> str:
    """The commit this run tests (read when it starts), marked when condattn/ differs from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "condattn"], cwd=ROOT, capture_output=True, text=True)
    return head.strip() + (" (condattn/ modified)" if dirty.stdout.strip() else "")


def provenance(seconds: float, k: str | None, tested: str) -> str:
    """The run's command, releases, commit and time."""
    import torch
    import transformers

    return (f"`python scripts/transformers_common.py{' --k ' + k if k else ''}`, "
            f"{datetime.now(timezone.utc):%Y-%m-%d}: transformers {transformers.__version__} (its "
            f"tests/test_modeling_common.py), torch {torch.__version__}, condattn at {tested}, CPU, "
            f"{seconds / 60:.1f} min")


def report(results, refused, methods, families, made: str) -> str:
    """The markdown page: `made` (provenance), the counts per family and method, the failures beyond `none`."""
    lines = ["# transformers' common model tests under each method", "",
             f"{made}. Passed / failed / skipped test cases per family (the model classes in "
             "scripts/transformers_common.py); failures beyond the unconditioned model's (`none`) named below the "
             "table.", "",
             "| method | " + " | ".join(families) + " |", "|---|" + "---|" * len(families)]
    extra: dict[str, set[str]] = defaultdict(set)
    for method in methods:
        cells = []
        for family in families:
            if (family, method) in refused:
                cells.append("refused")
                continue
            got = results.get((family, method), {})
            n = Counter(got.values())
            cells.append(f"{n['passed']} / {n['failed']} / {n['skipped']}")
            base = results.get((family, "none"), {})
            extra[method] |= {t.split("[")[0] for t, s in got.items() if s == "failed" and base.get(t) != "failed"}
        lines.append(f"| `{method}` | " + " | ".join(cells) + " |")
    lines.append("")
    for method in methods:
        if extra[method]:
            lines.append(f"- `{method}` fails beyond `none`: " + ", ".join(f"`{t}`" for t in sorted(extra[method])))
    for (family, method), why in sorted(refused.items()):
        lines.append(f"- `{method}` on {family} refused: {why}")
    base_fail = sorted({t.split("[")[0] for f in families for t, s in results.get((f, "none"), {}).items()
                        if s == "failed"})
    if base_fail:
        lines.append("- `none` (the unconditioned models with these testers) fails: " +
                     ", ".join(f"`{t}`" for t in base_fail))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import transformers

    import condattn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=list(condattn.conditioning.METHODS))
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--k", help="pytest -k expression (then results/transformers_common.md is not written)")
    args = ap.parse_args(argv)
    methods = ["none", *[m for m in args.methods if m != "none"]]
    refused = {(f, m): why for f in args.families for m in methods if (why := refusal(f, m))}
    tested = commit()
    pkg = sources(transformers.__version__)
    junit = pkg.parent / "junit.xml"
    seconds = run_tests(write_entry(pkg, methods, args.families), junit, args.k)
    text = report(outcomes(junit), refused, methods, args.families, provenance(seconds, args.k, tested))
    print(text)
    if not args.k and set(args.families) == set(FAMILIES):
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(text)
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
