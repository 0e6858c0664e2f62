"""Where in a YAML config a validation error points."""

from __future__ import annotations

from typing import Any

import yaml


def line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int:
    """The 1-based line of the deepest YAML node along a pydantic error location."""
    line = node.start_mark.line + 1 if node is not None else 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == part), None)
            if match is None:
                continue  # a union tag or a missing key: stay on the parent
            key_line = next(k.start_mark.line for k, v in node.value if v is match)
            node, line = match, key_line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
    return line
