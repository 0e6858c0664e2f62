"""Large CDM manifests written fast: partitions a check finds are made as JSON text, and spliced into the
serialization of the rest of the document (no dict per partition, no second encoding of them).

The result is the same JSON a dict would give (`tests/test_cdm_check.py` compares both with the CDM SDK).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from lakefeed import clock
from lakefeed.batch.discovery import INCREMENTAL_TRAIT, Pattern

PATTERN_NAME_ARGUMENT = "incrementPartitionPatternName"
_PLAIN = re.compile(r"[ !#-\[\]-~]*").fullmatch  # printable ASCII but `"` and `\`: quoted as it is
_PARTITION_LISTS = ("dataPartitions", "incrementalPartitions")


def quote(text: str) -> str:
    """A JSON string."""
    return f'"{text}"' if _PLAIN(text) else json.dumps(text, ensure_ascii=False)


class Stamps:
    """CDM times of file mtimes, fast: one formatted second per distinct second."""

    def __init__(self) -> None:
        self.seconds: dict[int, str] = {}  # second -> its CDM time up to the milliseconds

    def second(self, second: int) -> str:
        text = self.seconds[second] = clock.to_cdm(datetime.fromtimestamp(second, UTC))[:-5]
        return text

    @staticmethod
    def parts(mtime_ns: int) -> tuple[int, int]:
        """The second and millisecond the SDK stamps a file time with: the float seconds rounded to the microsecond
        (as `datetime.fromtimestamp` rounds), then cut to the millisecond. Cutting the ns at once is a millisecond
        less for the last ~0.5 µs of each millisecond; below the last microsecond (the float's error is ~0.24 µs)
        the cut is the same, and cheaper."""
        if mtime_ns % 1_000_000 < 999_000:
            return divmod(mtime_ns // 1_000_000, 1000)
        part, whole = math.modf(clock.seconds(mtime_ns))
        second, us = int(whole), round(part * 1e6)
        if us >= 1_000_000:
            second, us = second + 1, us - 1_000_000
        return second, us // 1000

    def __call__(self, mtime_ns: int) -> str:
        second, ms = self.parts(mtime_ns)
        return f"{self.seconds.get(second) or self.second(second)}.{ms:03d}Z"


class PartitionText:
    """Partitions as the SDK makes them from one pattern, as JSON text: the location, the pattern's specialized
    schema, its traits (the incremental one naming the pattern), the captured arguments, and the times."""

    def __init__(self, decl: dict[str, Any], pattern: Pattern, incremental: bool, now: str,
                 stamp: Stamps) -> None:
        self.incremental, self._stamp = incremental, stamp
        self._names = [f'{{"name":{quote(p)},"value":' for p in pattern.parameters]
        self._groups = min(pattern.expression.groups or 0, len(pattern.parameters))
        traits = json.loads(json.dumps(decl.get("exhibitsTraits") or []))
        if incremental:
            for trait in traits:
                if isinstance(trait, dict) and trait.get("traitReference") == INCREMENTAL_TRAIT:
                    args = trait.get("arguments")
                    if isinstance(args, list):
                        args.append({"name": PATTERN_NAME_ARGUMENT, "value": pattern.name})
        schema = decl.get("specializedSchema")
        self._middle = (f',"specializedSchema":{quote(str(schema))}' if schema else "") + \
            (f',"exhibitsTraits":{json.dumps(traits, ensure_ascii=False, separators=(",", ":"))}' if traits else "")
        self._checked = f',"lastFileStatusCheckTime":"{now}","lastFileModifiedTime":"'
        arguments = ",".join(f'{name}"%s"}}' for name in (n.replace("%", "%%") for n in self._names[: self._groups]))
        self._format = ('{"location":"%s"' + self._middle.replace("%", "%%")
                        + (f',"arguments":[{arguments}]' if arguments else "") + self._checked.replace("%", "%%")
                        + '%s.%03dZ"}')  # every capture taken and plain: the text is one `%` format (`many`)

    def __call__(self, location: str, match: Any, mtime: int) -> str:
        """`location` ends with the matched path: when that is plain, so are the captures taken from it."""
        plain = _PLAIN(location) is not None
        arguments = []
        for name, value in zip(self._names, match.groups()[: self._groups], strict=False):
            if value is None:  # a group that took no part: it and the rest give no argument
                break
            # A group's last capture, as the SDK takes.
            arguments.append(f'{name}"{value}"}}' if plain else f"{name}{quote(value)}}}")
        listed = f',"arguments":[{",".join(arguments)}]' if arguments else ""
        where = f'"{location}"' if plain else quote(location)
        return f'{{"location":{where}{self._middle}{listed}{self._checked}{self._stamp(mtime)}"}}'


    def many(self, root_location: str, files: list[tuple[str, int]],
             fullmatch: Callable[[str], Any]) -> tuple[list[str], int]:
        """The partitions of every file of a listing (`("/relative/path", mtime_ns)`) that a pattern matches, and
        the latest of their mtimes (-1: none): what one call per file gives, made fast where every name is plain.
        `fullmatch` must not time out (a linear pattern)."""
        cut = 0 if root_location else 1  # the location: below the root location, or the folder's own path
        if _PLAIN(root_location) is None or _PLAIN("".join([name for name, _ in files])) is None:
            return self._each(root_location, files, fullmatch, cut)
        out: list[str] = []
        add, fmt, groups, parts = out.append, self._format, self._groups, self._stamp.parts
        seconds, second = self._stamp.seconds, self._stamp.second
        newest = -1
        for name, mtime in files:
            match = fullmatch(name)
            if match is None:
                continue
            captures = match.groups()[:groups]
            if None in captures:  # an optional group took no part: it and the rest give no argument
                add(self((root_location + name)[cut:], match, mtime))
            else:
                at, ms = parts(mtime)
                add(fmt % ((root_location + name)[cut:], *captures, seconds.get(at) or second(at), ms))
            if mtime > newest:
                newest = mtime
        return out, newest

    def _each(self, root_location: str, files: list[tuple[str, int]], fullmatch: Callable[[str], Any],
              cut: int) -> tuple[list[str], int]:
        out: list[str] = []
        newest = -1
        for name, mtime in files:
            if (match := fullmatch(name)) is not None:
                out.append(self((root_location + name)[cut:], match, mtime))
                newest = max(newest, mtime)
        return out, newest


class Splices:
    """Partition texts standing in a document's partition lists as tokens until it is serialized."""

    def __init__(self) -> None:
        self._texts: dict[str, list[str]] = {}

    def token(self, texts: list[str]) -> str:
        token = f"\x00lakefeed:{len(self._texts)}\x00"
        self._texts[token] = texts
        return token

    def count(self) -> int:
        return sum(map(len, self._texts.values()))

    def dumps(self, doc: dict[str, Any], compact: bool) -> str:
        """The document's JSON: compact with the texts spliced in, or indented with them parsed back (small)."""
        if not compact:
            for entity in doc.get("entities") or ():
                for key in _PARTITION_LISTS if isinstance(entity, dict) else ():
                    if isinstance(entity.get(key), list):
                        entity[key] = [p for item in entity[key] for p in (
                            [json.loads(t) for t in self._texts[item]] if isinstance(item, str)
                            and item in self._texts else [item])]
            return json.dumps(doc, ensure_ascii=False, indent=2)
        pieces = [json.dumps(doc, ensure_ascii=False, separators=(",", ":"))]
        for token, texts in self._texts.items():
            before, after = pieces.pop().split(json.dumps(token), 1)
            pieces += [before, ",".join(texts), after]
        return "".join(pieces)
