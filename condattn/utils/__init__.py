"""Leaf utilities of the harness (files, hashing): they import nothing else of condattn."""
