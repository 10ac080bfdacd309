"""Compose the Hydra config from Python (what `reproduce`, `diagnose` and the tests use)."""

from __future__ import annotations

import copy
import difflib
import os
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CONFIG_DIR = Path(os.environ.get("CONDATTN_CONFIG_DIR", Path(__file__).resolve().parent.parent / "configs"))


def _epoch_steps(samples: int, batch: int, epochs: int = 1) -> int:
    """Optimizer steps of `epochs` passes over `samples` at global batch `batch` (the last partial batch dropped, as
    the trainer's sampler does)."""
    steps = int(epochs) * (int(samples) // int(batch))
    if steps < 1:
        raise ValueError(f"{samples} samples make no full global batch of {batch}")
    return steps


def _glue_num_labels(task: str) -> int:
    from .data.glue_tasks import glue_task

    return glue_task(str(task)).num_labels


# `${epoch_steps:SAMPLES,BATCH[,EPOCHS]}` in a config: epochs expressed as optimizer steps (the GLUE task configs);
# `${glue_num_labels:TASK}`: the classifier's outputs for a GLUE task (1 = regression)
OmegaConf.register_new_resolver("epoch_steps", _epoch_steps, replace=True)
OmegaConf.register_new_resolver("glue_num_labels", _glue_num_labels, replace=True)


_COMPOSED: dict[tuple, DictConfig] = {}  # compose's results in this process, by everything they depend on
_LOADED: dict[tuple, object] = {}  # each config file as Hydra loaded it, by source, file, size and mtime


def _load_once(source_type: type) -> type:
    """Hydra's config source `source_type`, reading each file once a process. Hydra parses every file of the defaults
    tree again at every compose (about 20 files, 9 ms each here, most of it PyYAML in Python); a copy of the loaded
    config is a quarter of that. A file whose size or mtime changed is read again."""
    import dataclasses

    class LoadOnce(source_type):
        condattn_load_once = True

        def load_config(self, config_path: str):
            key = (self.scheme(), self.path, config_path)
            if self.scheme() == "file":
                full = os.path.realpath(os.path.join(self.path, self._normalize_file_name(config_path)))
                st = os.stat(full) if os.path.exists(full) else None
                key += (st and (st.st_size, st.st_mtime_ns),)
            if key not in _LOADED:
                _LOADED[key] = super().load_config(config_path)  # raises for a missing file, as Hydra does
            got = _LOADED[key]
            return dataclasses.replace(got, config=copy.deepcopy(got.config), header=dict(got.header))

    LoadOnce.__name__ = LoadOnce.__qualname__ = source_type.__name__
    return LoadOnce


def _hydra_loads_each_file_once() -> None:
    """Hydra's file and package sources replaced, in this process, by `_load_once`'s (its registry of sources by
    scheme is where Hydra looks one up)."""
    from hydra._internal.sources_registry import SourcesRegistry
    from hydra.core.plugins import Plugins

    Plugins.instance()  # Hydra registers its own sources first
    types = SourcesRegistry.instance().types
    for scheme in ("file", "pkg"):
        if scheme in types and not getattr(types[scheme], "condattn_load_once", False):
            types[scheme] = _load_once(types[scheme])


def _inputs(overrides, config_name: str) -> tuple:
    """What a composed config depends on: the overrides, every config file (path, size, mtime), the CONDATTN_*
    variables the configs read and the working directory (`resolve_paths`)."""
    files = tuple((str(f), st.st_size, st.st_mtime_ns) for f in sorted(CONFIG_DIR.rglob("*.yaml"))
                  for st in [f.stat()])
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("CONDATTN_")))
    return (config_name, tuple(overrides), str(CONFIG_DIR), files, env, os.getcwd())


def compose(overrides: list[str] | tuple[str, ...] = (), config_name: str = "train") -> DictConfig:
    """The config `python -m condattn.train OVERRIDES...` would run with. A bad override (unknown group
    option, missing key) raises with Hydra's message naming it. Hydra takes ~0.2 s a config and a table plans each
    cell from several: a config composed before from the same inputs is returned as a copy of that one, and each
    config file is parsed once (`_load_once`)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if not CONFIG_DIR.is_dir():
        raise FileNotFoundError(f"config directory {CONFIG_DIR} not found; set CONDATTN_CONFIG_DIR")
    key = _inputs(overrides, config_name)
    if key not in _COMPOSED:
        if len(_COMPOSED) >= 256:  # bounded: the oldest goes first
            del _COMPOSED[next(iter(_COMPOSED))]
        GlobalHydra.instance().clear()
        _hydra_loads_each_file_once()
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            _COMPOSED[key] = resolve_paths(hydra_compose(config_name=config_name, overrides=list(overrides)))
    return copy.deepcopy(_COMPOSED[key])


PROJECT_ROOT = CONFIG_DIR.parent  # where configs/ lives: the clone
PATH_KEYS = ("runs", "results", "cache", "data_root")


def resolve_paths(cfg: DictConfig) -> DictConfig:
    """Relative `paths.*` (runs, results, cache, data_root) mean the project root's folders wherever the command runs:
    they are made absolute against PROJECT_ROOT, so `--report-only` run from a subdirectory reads the project's runs
    (it wrote an all-missing table there) and a run's files land where its table looks for them. The CONDATTN_*
    variables or absolute paths choose other folders. Run from the project root, the config is left as composed."""
    paths = cfg.get("paths") if isinstance(cfg, DictConfig) else None
    if paths is None or Path.cwd().resolve() == PROJECT_ROOT.resolve():
        return cfg
    for key in PATH_KEYS:
        value = paths.get(key)
        if value is not None and not Path(str(value)).is_absolute():
            paths[key] = str(PROJECT_ROOT / str(value))
    return cfg


# Keys the code reads where they are set, though no config file declares them: the only keys a `+key=value` override
# may add (any other one is read by nothing, and would only rename the run). Where each is read:
ADDABLE_KEYS = {
    "data.test_per_class": "data/images.py: a stratified test split of that many images per class",
    "task.augment.shift_px": "data/images.py ShiftedImages: shifted copies of each training image",
}


class ConfigError(ValueError):
    """A bad override or config, explained in one line."""


def _group_options_with(key: str) -> list[str]:
    """The options of `key`'s group (configs/<group>/*.yaml) that declare it: data.image_size -> lra_image, ..."""
    import yaml

    group, _, rest = key.partition(".")
    found = []
    for f in sorted((CONFIG_DIR / group).glob("*.yaml")) if rest else []:
        try:
            node = yaml.safe_load(f.read_text())
        except (OSError, yaml.YAMLError):
            continue
        for part in rest.split("."):
            node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
        if node is not KeyError:
            found.append(f.stem)
    return found


def _did_you_mean(key: str, overrides: list[str]) -> str:
    """The hint after "names no key of the config": the group options that have the key, when some do (then it is
    simply not a key of this config, and no other key is suggested), else the key of this config it may be a typo of
    (close in spelling)."""
    if elsewhere := _group_options_with(key):
        group = key.partition(".")[0]
        return f"; {key} is a key of {group}={', '.join(elsewhere)} only, not of this config's {group}"
    parent, _, last = key.rpartition(".")
    try:
        groups = [o for o in overrides if "=" in o and "." not in o.split("=", 1)[0]]  # group choices only
        base = compose(groups)
        node = OmegaConf.select(base, parent) if parent else base
        keys = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
    except Exception:
        return ""
    close = difflib.get_close_matches(last, keys, n=1, cutoff=0.75)  # a typo (image_sise), not another word
    return f"; did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""


def unparsable_override(overrides: list[str]) -> str | None:
    """One line, the cause first, naming the first override Hydra cannot parse (None when each parses): a key with no
    `=`, a bare `=`, or a value split off by spaces (`ARGS="conditioning.lam = 2"` reaches us as three words)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    spaced = any(o == "=" or o.endswith("=") or o.startswith("=") for o in overrides)
    hint = ("; write each override as one word key=value, without spaces around '=' (e.g. ARGS=\"conditioning.lam=2\")"
            if spaced else "; write it as key=value (e.g. conditioning.lam=2)")
    for o in overrides:
        if o == "=" or o.startswith("="):
            return f"override {o!r} has no key (a space before '='?){hint}"
        if o.endswith("=") and spaced:
            return f"override {o!r} has no value (a space after '='?){hint}"
        try:
            parser.parse_override(o)
        except Exception as e:  # noqa: BLE001 - Hydra's grammar errors (HydraException, Lexer/Parser exceptions)
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]
            cause = "is not key=value" if "=" not in o else f"cannot be parsed ({why})"
            return f"override {o!r} {cause}{hint}"
    return None


def explain_override_error(overrides: list[str], exc: Exception) -> str:
    """One line, the cause first, saying which override is wrong and what would be right (never the whole override
    list: the same mistake in every cell of a table is then one message)."""
    if bad := unparsable_override(overrides):
        return bad
    msg = str(exc)
    if m := re.search(r"Could not find '([^/']+)/([^']+)'", msg):
        group, option = m.groups()
        avail = re.findall(r"^\t(\S+)$", msg.split("Config search path")[0], flags=re.M)
        close = difflib.get_close_matches(option, avail, n=1, cutoff=0.5)
        hint = f"did you mean {group}={close[0]}? " if close else ""
        return f"override '{group}={option}': there is no configs/{group}/{option}.yaml; {hint}available: " + \
            ", ".join(avail)
    if m := re.search(r"Could not override '([^']+)'", msg):
        key = m.group(1)
        given = next((o for o in overrides if o.split("=", 1)[0].lstrip("+~") == key), key)
        return f"override '{given}' names no key of the config{_did_you_mean(key, overrides)}"
    first = msg.strip().splitlines()[0] if msg.strip() else type(exc).__name__
    named = [o for o in overrides if "=" in o and o.split("=", 1)[0].lstrip("+~") in first]
    if named:
        return f"{first} (override {named[0]!r})"
    # the cell's own name and seed left out: the same mistake in every cell of a table reads as one message
    shared = [o for o in overrides if not o.startswith(("run.name=", "run.row=", "run.table=", "seed="))]
    return f"{first} (overrides: {' '.join(shared)})"


def compose_cell(overrides: list[str]) -> DictConfig:
    """`compose(overrides)` with a one-line ConfigError naming the bad override."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return compose(overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise ConfigError(explain_override_error(overrides, e)) from e
