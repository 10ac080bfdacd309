"""Floors: what the majority class and classical models reach on a small table's own data split
(`python -m condattn.floors --scale small`; see compute.py)."""
