"""`condattn.config.compose` reads each config file once a process (`_load_once`): what it returns is what Hydra's own
sources return, a caller's edit of a result never reaches the next compose, and an edited file is read again."""

from hydra._internal.core_plugins.file_config_source import FileConfigSource
from omegaconf import OmegaConf

from condattn import config as C


def test_each_config_file_loads_as_hydras_own_source_loads_it():
    plain = FileConfigSource(provider="main", path=f"file://{C.CONFIG_DIR}")
    once = C._load_once(FileConfigSource)(provider="main", path=f"file://{C.CONFIG_DIR}")
    names = ["train.yaml", "model/vit_tiny_32.yaml", "scale_recipe/imagenet_vit_noaug_small.yaml"]
    names += sorted(p.relative_to(C.CONFIG_DIR).as_posix() for p in C.CONFIG_DIR.rglob("*.yaml")
                    if "@package" in p.read_text()[:512])[:3]  # a header Hydra reads
    for name in names:
        want, got, again = plain.load_config(name), once.load_config(name), once.load_config(name)
        for res in (got, again):
            assert OmegaConf.to_container(res.config) == OmegaConf.to_container(want.config), name
            assert res.header == want.header and res.path == want.path and res.provider == want.provider, name
    assert again.config is not got.config  # each load is a copy: Hydra edits what it loaded


def test_an_edited_file_is_read_again_and_a_callers_edit_stays_with_the_caller(tmp_path, monkeypatch):
    monkeypatch.setattr(C, "CONFIG_DIR", tmp_path)

    def _compose_from(_):
        return C.compose([], config_name="train")

    (tmp_path / "part").mkdir()
    (tmp_path / "train.yaml").write_text("defaults:\n  - part: a\n  - _self_\nname: first\n")
    (tmp_path / "part" / "a.yaml").write_text("width: 8\n")
    cfg = _compose_from(tmp_path)
    assert (cfg.name, cfg.part.width) == ("first", 8)
    cfg.part.width = 99  # the caller's copy
    assert _compose_from(tmp_path).part.width == 8
    (tmp_path / "part" / "a.yaml").write_text("width: 16\n")  # another size: read again
    (tmp_path / "train.yaml").write_text("defaults:\n  - part: a\n  - _self_\nname: second\n")
    cfg = _compose_from(tmp_path)
    assert (cfg.name, cfg.part.width) == ("second", 16)


def test_a_missing_config_is_hydras_error():
    once = C._load_once(FileConfigSource)(provider="main", path=f"file://{C.CONFIG_DIR}")
    try:
        once.load_config("model/no_such_model.yaml")
    except Exception as err:  # Hydra's ConfigLoadError, naming the file
        assert "no_such_model" in str(err)
    else:
        raise AssertionError("a missing file loaded")
