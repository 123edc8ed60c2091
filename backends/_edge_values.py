"""What the backends' validators share: reading a node's arguments (``argument``)."""
from __future__ import annotations

from typing import Any

import torch.fx


def argument(node: torch.fx.Node, name: str, default: Any = None) -> Any:
    """The node's argument ``name`` (by its op's schema), or its default."""
    for i, a in enumerate(node.target._schema.arguments):
        if a.name == name:
            if i < len(node.args):
                return node.args[i]
            if name in node.kwargs:
                return node.kwargs[name]
            return a.default_value if a.has_default_value() else default
    return default
