"""Eager ATen: the partition's nodes run in place, op by op. The end of every chain."""
from __future__ import annotations

from arbiter.backend import Backend
from arbiter.registry import register_backend


@register_backend
class Eager(Backend):
    name = "eager"
    color = "#9d9d9d"  # fixed in every report (arbiter/report/html.py)
    inline_aten = True

    def compile(self, gm, example_inputs):
        return gm

    @classmethod
    def declared_ops(cls):
        return None  # the manifest is a wildcard: everything ATen can run
