"""Run summaries -> tables (Markdown/CSV) beside the papers' numbers, and training-curve figures."""

from .tables import METHOD_LABELS, collect, render, write_table

__all__ = ["METHOD_LABELS", "collect", "render", "write_table"]
