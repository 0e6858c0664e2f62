"""Reading a YAML config, and where in it a validation error points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from lakefeed.errors import ConfigError


def read_yaml(path: Path) -> tuple[yaml.Node | None, Any]:
    """The file's YAML node tree (for error lines) and its data, or ConfigError saying where it cannot be read."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError([f"{path}:1: (file): cannot read: {exc.strerror}"]) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError([f"{path}:{line}: (file): byte {raw[exc.start]:#04x} is not UTF-8: save the file as "
                           "UTF-8"]) from exc
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        check_duplicate_keys(node, str(path))
        return node, yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise ConfigError([f"{path}:{line}: (yaml): {getattr(exc, 'problem', exc)}"]) from exc
    except RecursionError as exc:
        raise ConfigError([f"{path}:1: (yaml): nested too deeply to read"]) from exc


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


def check_duplicate_keys(node: yaml.Node | None, name: str) -> None:
    """Raise a YAML error at a mapping's second use of a key: YAML forbids it, and PyYAML would silently keep the
    last value (an entity given two names would be named by the second)."""
    stack = [node] if node is not None else []
    while stack:
        current = stack.pop()
        if isinstance(current, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key, value in current.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if key.value in seen:
                        raise yaml.constructor.ConstructorError(
                            f"in {name}", seen[key.value].start_mark,
                            f"the key {key.value!r} is given twice (first on line "
                            f"{seen[key.value].start_mark.line + 1}): keep one", key.start_mark)
                    seen[key.value] = key
                stack.append(value)
        elif isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)
