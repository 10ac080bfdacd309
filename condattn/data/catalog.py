"""Every dataset module, imported so that it registers its builder and paper-data check (data/registry.py).

A new dataset is one module with `@register_dataset(...)` plus one line here.
"""

from __future__ import annotations

from . import coco, glue, images, listops, lm_text, lra_image, lra_retrieval, lra_text, mlm_text, pathfinder

MODULES = (listops, images, lra_text, lra_retrieval, lra_image, pathfinder, lm_text, mlm_text, glue, coco)
