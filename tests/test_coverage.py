"""SCA's reach (conditioning/coverage.py): the transformers types of issue 27 at tiny random configs, and one timm
model per model module counted on the meta device. Each row: patched == attention layers, state_dict keys unchanged,
and (transformers: real forward) output changed and restored bit-exactly by remove_conditioning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from condattn.conditioning.coverage import smallest_timm_model, timm_rows, transformers_rows

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def test_every_listed_transformers_type_is_patched_on_every_attention_layer():
    rows = transformers_rows()
    assert len(rows) == 34
    bad = [f"{r.family}: {r.patched}/{r.attention} {r.output} {r.why}" for r in rows
           if not (r.full and r.output == "changed+restored")]
    assert not bad, bad


TIMM_RECORD = json.loads((Path(__file__).parent / "fixtures" / "timm_smallest.json").read_text())
# Measured at issue 27: 43 of 47 timm attention families on every layer (14 of 45 before structural matching, 32 before
# 1×1-conv projections, 40 before λI on W before its BatchNorm: LeViT, EfficientFormer-V2, 42 before GCViT's global
# attention, which has no W_Q, got λI on its W_K, W_V); issue 37: EfficientViT-MSRA's cascaded heads are conditioned
# head by head, CoaT's factorised attention is refused. The other 4 hold attention without q·kᵀ logits (SwiftFormer,
# VOLO's outlook, NextViT's MHCA, CoaT), each refused in one line that says so (docs/coverage.md): every family with
# q·kᵀ logits is covered. Every other timm module has no attention layer.
FULL = {"beit", "byoanet", "cait", "convit", "cpubone", "crossvit", "csatv2", "davit", "deepseek_vit", "deit",
        "edgenext", "efficientformer", "efficientformer_v2", "efficientvit_msra", "eva", "gcvit", "gemma4_vit", "hiera",
        "hieradet_sam2", "levit", "lowformer", "maxxvit", "mobilenetv5", "mobilevit", "mvitv2", "naflexvit", "nest",
        "pit", "pvt_v2", "qwen3_vit", "swin_transformer", "swin_transformer_v2", "swin_transformer_v2_cr", "tiny_vit",
        "tnt", "twins", "visformer", "vision_transformer", "vision_transformer_hybrid", "vision_transformer_relpos",
        "vision_transformer_sam", "vitamin", "xcit"}
REFUSED = {"swiftformer": "no q·kᵀ", "volo": "no q·kᵀ", "nextvit": "no q·kᵀ", "coat": "no q·kᵀ"}


def test_the_timm_record_is_the_installed_timms():
    """tests/fixtures/timm_smallest.json names each timm model module's smallest model (of its first 12, by parameter
    count on the meta device) under the pinned timm, so that the reach below builds one model per family, not twelve.
    A new timm release fails here: `python scripts/coverage_table.py` writes the record again."""
    import timm

    fix = "run `.venv/bin/python scripts/coverage_table.py` to record this timm's models"
    assert TIMM_RECORD["timm"] == timm.__version__, fix
    assert sorted(timm.list_modules()) == sorted(TIMM_RECORD["smallest"]), fix
    assert len(FULL) >= 43 and len(FULL) + len(REFUSED) >= 47 and not FULL & set(REFUSED)


@pytest.mark.parametrize("mod", ["deit", "efficientnet"])
def test_the_recorded_model_is_the_smallest(mod):
    """The record's choice is smallest_timm_model's (checked on two modules: deit3_small is not the first of deit's
    names; all 98 would build 12 models each)."""
    assert smallest_timm_model(mod)[0] == TIMM_RECORD["smallest"][mod]


@pytest.mark.parametrize("mod", sorted(TIMM_RECORD["smallest"]))
def test_timm_family_reach(mod):
    """Each timm model module's recorded model: a covered family is patched on every attention layer, a refused one
    says why in one line, and a module with no attention has no row."""
    rows = timm_rows([mod], chosen=TIMM_RECORD["smallest"])
    if mod in FULL:
        assert len(rows) == 1 and rows[0].full, [(r.model, r.patched, r.attention, r.why) for r in rows]
    elif mod in REFUSED:
        assert len(rows) == 1 and not rows[0].full and REFUSED[mod] in rows[0].why, rows
    else:
        assert rows == [], rows
