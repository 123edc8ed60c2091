"""Configs shipped with torch-arbiter (``default.yaml`` is the embedded default)."""
