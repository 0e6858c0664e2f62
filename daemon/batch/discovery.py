"""Discovery: which partition of an entity a landed file is, by CDM pattern semantics.

Follows the CDM manifest spec and, where it is silent, Microsoft's CDM SDK
(`cdm_data_partition_pattern_def.py`): the pattern is matched in full against the file's
path relative to `rootLocation`, written with a leading `/`; `globPattern` is preferred over
`regularExpression`; captured groups become arguments for `parameters` in order, stopping
at the first group that did not take part. Where the spec and the SDK disagree (which of
several matching patterns wins) the spec is followed: the last pattern processed takes
precedence, unless the entity says `pattern_precedence: sdk` (the first). Explicitly listed
partitions are never overwritten by inferred ones.
See docs/cdm-discovery.md.
"""

from __future__ import annotations

import re
import re._constants as re_constants
import re._parser as re_parser
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import regex

from lakefeed import log

INCREMENTAL_TRAIT = "is.partition.incremental"
INCREMENTAL_TYPES = ("Insert", "Update", "Delete", "Upsert", "UpsertAndDelete")
# Patterns come from manifests anybody may edit: `regex` (Python's re syntax) cuts short the catastrophic
# backtracking that re would spend minutes on, and gives up after this long, as the CDM SDK does.
MATCH_TIME_LIMIT_S = 1.0
_log = log.get(__name__)


@dataclass(frozen=True)
class Pattern:
    name: str
    root_location: str
    expression: regex.Pattern[str]
    parameters: tuple[str, ...] = ()
    incremental_type: str | None = None
    linear: bool = False  # cannot backtrack catastrophically: matched without the (costly) time limit

    def fullmatch(self, path: str) -> regex.Match[str] | None:
        """The full match of a path; TimeoutError past MATCH_TIME_LIMIT_S unless the pattern is `linear`."""
        if self.linear:
            return self.expression.fullmatch(path)
        return self.expression.fullmatch(path, timeout=MATCH_TIME_LIMIT_S)


_UNBOUNDED = 2  # unbounded repeats a linear pattern may have: at worst O(n²) over a path's n characters


def is_linear(source: str) -> bool:
    """Whether a pattern cannot backtrack catastrophically: no repeated group (the `(a+)+` kind) and at most two
    unbounded repeats. Patterns Python's `re` cannot parse (`regex`-only syntax) count as not linear."""
    try:
        parsed = re_parser.parse(source)
    except (re.error, RecursionError, OverflowError):
        return False
    unbounded = 0

    def walk(items: Any, inside_repeat: bool) -> bool:
        nonlocal unbounded
        for op, arg in items:
            if op in (re_constants.MAX_REPEAT, re_constants.MIN_REPEAT, re_constants.POSSESSIVE_REPEAT):
                low, high, body = arg
                if inside_repeat or any(o in (re_constants.SUBPATTERN, re_constants.BRANCH) for o, _ in body):
                    return False
                unbounded += high == re_constants.MAXREPEAT
                if not walk(body, True):
                    return False
            elif op == re_constants.SUBPATTERN:
                if not walk(arg[-1], inside_repeat):
                    return False
            elif op == re_constants.BRANCH:
                if not all(walk(branch, inside_repeat) for branch in arg[1]):
                    return False
            elif op in (re_constants.ASSERT, re_constants.ASSERT_NOT, re_constants.GROUPREF,
                        re_constants.GROUPREF_EXISTS, re_constants.ATOMIC_GROUP):
                return False
        return True

    return walk(parsed, False) and unbounded <= _UNBOUNDED


@dataclass(frozen=True)
class Partition:
    """A discovered (or explicitly listed) partition of one file."""

    location: str
    arguments: dict[str, list[str]] = field(default_factory=dict)
    incremental_type: str | None = None
    pattern_name: str | None = None
    explicit: bool = False


def argument_clash(partition: Partition, columns: Collection[str]) -> str | None:
    """Why a file's rows cannot take its partition arguments, if a data column has an argument's name.

    Either value would be lost without a word: the column is the data's, the argument the path's, and
    a row has one value per name (docs/cdm-discovery.md)."""
    clashes = sorted(set(partition.arguments) & set(columns))
    if not clashes:
        return None
    names = ", ".join(map(repr, clashes))
    source, fix = (f"that pattern {partition.pattern_name!r} captures from the path", "the pattern's parameter") \
        if partition.pattern_name else ("listed for the file in the manifest", "the partition's argument")
    return (f"column(s) {names} of the file clash with the partition argument(s) of the same name {source}: rename "
            f"{fix} or the column; the file's rows are not applied")


def normalize_location(location: str) -> str:
    """A corpus path compared by its place under the manifest folder."""
    for prefix in ("local:", "./"):
        location = location.removeprefix(prefix)
    return location.lstrip("/")


def glob_to_regex(glob: str) -> str:
    """The CDM SDK's glob translation, with regex metacharacters that globs treat as literals escaped.

    The SDK leaves `+ ( ) { } ^ $ |` unescaped, so a glob `a+b.csv` never matches the file
    of that name there; here it does (docs/cdm-discovery.md).
    """
    out = ["[/\\\\]"]
    i = 1 if glob[:1] in ("/", "\\") else 0
    while i < len(glob):
        c = glob[i]
        if c == ".":
            out.append("\\.")
        elif c == "\\":
            out.append("[/\\\\]")
        elif c == "?":
            out.append(".")
        elif c == "*":
            if glob[i + 1 : i + 2] == "*":
                prev = glob[i - 1] if i > 0 else None
                post = glob[i + 2] if i + 2 < len(glob) else None
                if prev in (None, "/", "\\") and post in (None, "/", "\\"):
                    out.append(".*")
                    if prev in ("/", "\\") and post in ("/", "\\"):
                        out.append("/?")
                        i += 1
                else:
                    out.append("[^/\\\\]*")
                i += 1
            else:
                out.append("[^/\\\\]*")
        elif c in "+(){}^$|":
            out.append("\\" + c)
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _trait_args(declaration: dict[str, Any], trait: str) -> dict[str, Any] | None:
    for ref in declaration.get("exhibitsTraits") or ():
        name = ref if isinstance(ref, str) else ref.get("traitReference")
        if name == trait:
            args = {} if isinstance(ref, str) else ref.get("arguments") or []
            if isinstance(args, dict):
                return args
            return {str(a.get("name")): a.get("value") for a in args if isinstance(a, dict)}
    return None


def parse_arguments(raw: Any) -> dict[str, list[str]]:
    """Partition arguments in either form the spec shows: `{name, value}` items or `{name: [values]}`."""
    args: dict[str, list[str]] = {}
    for item in raw or ():
        if not isinstance(item, dict):
            continue
        if "name" in item and "value" in item:
            args.setdefault(str(item["name"]), []).append(str(item["value"]))
        else:
            for name, values in item.items():
                values = values if isinstance(values, list) else [values]
                args.setdefault(str(name), []).extend(str(v) for v in values)
    return args


def incremental_type(declaration: dict[str, Any], incremental: bool, listed_in: str) -> tuple[str | None, str | None]:
    """The CDC type a pattern or partition declares, or what to fix when it declares none lakefeed may apply.

    The trait's `type` is required and has no default (foundations.cdm.json), so a missing or unknown one is
    an error, never the strategy's kind; a data pattern or partition must not carry the trait at all."""
    trait = _trait_args(declaration, INCREMENTAL_TRAIT)
    allowed = ", ".join(INCREMENTAL_TYPES)
    if not incremental:
        return None, None if trait is None else f"it is data, yet carries {INCREMENTAL_TRAIT}; move it to {listed_in}"
    kind = (trait or {}).get("type")
    if kind in INCREMENTAL_TYPES:
        return kind, None
    if trait is None:
        return None, f"it carries no trait {INCREMENTAL_TRAIT}; add it with a `type` of {allowed}"
    if kind is None:
        return None, f"trait {INCREMENTAL_TRAIT} has no `type` (it has no default); set it to one of {allowed}"
    near = next((t for t in INCREMENTAL_TYPES if isinstance(kind, str) and t.lower() == kind.replace("_", "").lower()),
                None)
    hint = f"write {near!r} (types are case-sensitive)" if near else f"use one of {allowed}"
    return None, f"the `type` {kind!r} of trait {INCREMENTAL_TRAIT} is not a CDM incremental type; {hint}"


def partition_from_json(declaration: dict[str, Any], incremental: bool) -> Partition | str:
    """An explicitly listed partition from its manifest JSON, or why its file cannot be applied (logged, as an invalid
    pattern is, once per discovery): the change kind of its rows must not be guessed."""
    location = declaration["location"]
    kind, problem = incremental_type(declaration, incremental, "incrementalPartitions")
    if problem is not None:
        _log.error("partition.invalid", location=location, reason=problem)
        return (f"the manifest lists it as a partition that cannot be applied: {problem}; fix the manifest, then "
                "land the file again")
    return Partition(location, parse_arguments(declaration.get("arguments")), kind, None, True)


def pattern_from_json(declaration: dict[str, Any], incremental: bool) -> Pattern | None:
    """A pattern from its manifest JSON, or None (logged) when it cannot be used."""
    name = declaration.get("name") or ""
    glob, regular = declaration.get("globPattern"), declaration.get("regularExpression")
    source = glob_to_regex(glob) if glob and glob.strip() else regular
    kind, problem = incremental_type(declaration, incremental, "incrementalPartitionPatterns")
    if problem is not None:
        _log.error("pattern.invalid", pattern=name, reason=problem)
        return None
    if not source or not source.strip():
        _log.error("pattern.invalid", pattern=name, reason="no regularExpression or globPattern")
        return None
    try:
        expression = regex.compile(source)
    except regex.error as exc:
        _log.error("pattern.invalid", pattern=name, reason=f"expression does not compile: {exc}")
        return None
    root = str(declaration.get("rootLocation") or "")
    return Pattern(name, root, expression, tuple(declaration.get("parameters") or ()), kind, is_linear(source))


class Discovery:
    """Matches relative file paths (relative to the manifest folder) to partitions."""

    def __init__(self, patterns: Iterable[Pattern], explicit: Iterable[tuple[Partition, bool]] = (),
                 first_wins: bool = False, invalid: Mapping[str, str] | None = None) -> None:
        """`invalid`: listed locations whose partition cannot be applied -> why; patterns never take them (an
        inferred partition never overwrites a listed one), so their files are unmatched with that reason."""
        self.patterns = tuple(patterns)
        self.first_wins = first_wins  # `pattern_precedence: sdk`: as the CDM SDK, the first pattern that matches
        self.invalid = {normalize_location(location): reason for location, reason in (invalid or {}).items()}
        self._explicit: dict[str, Partition] = {}
        self._lists: dict[str, set[bool]] = {}  # location -> the lists that name it (incremental: True)
        for partition, incremental in explicit:
            location = normalize_location(partition.location)
            self._explicit[location] = partition
            self._lists.setdefault(location, set()).add(incremental)
        self.timed_out: dict[str, str] = {}  # path -> the pattern that took too long on it

    @classmethod
    def from_entity(cls, entity: dict[str, Any], owned: Collection[str] = (), precedence: str = "spec",
                    doubled: Mapping[str, bool] | None = None) -> Discovery:
        """From a local entity declaration; partitions whose locations lakefeed wrote are not explicit: those of
        `owned`, and those of `doubled` in the list it names (see `also`).
        `precedence`: of several matching patterns the last processed wins (`spec`) or the first (`sdk`)."""
        doubled = doubled or {}
        patterns = [pattern_from_json(p, False) for p in entity.get("dataPartitionPatterns") or ()]
        patterns += [pattern_from_json(p, True) for p in entity.get("incrementalPartitionPatterns") or ()]
        explicit, invalid = [], {}
        for key, incremental in (("dataPartitions", False), ("incrementalPartitions", True)):
            for decl in entity.get(key) or ():
                location = decl.get("location")
                if not location or normalize_location(location) in owned or \
                        doubled.get(normalize_location(location)) is incremental:
                    continue
                partition = partition_from_json(decl, incremental)
                if isinstance(partition, str):
                    invalid[location] = partition
                else:
                    explicit.append((partition, incremental))
        return cls([p for p in patterns if p is not None], explicit, precedence == "sdk", invalid)

    def match(self, relative_path: str) -> Partition | None:
        location = normalize_location(relative_path)
        if location in self.invalid:
            return None
        explicit = self._explicit.get(location)
        if explicit is not None:
            return explicit
        found = None
        for pattern in self.patterns:  # the last pattern processed takes precedence
            partition = self._match(pattern, relative_path)
            if partition is not None:
                if self.first_wins:
                    return partition
                found = partition
        return found

    def also(self, relative_path: str, found: Partition) -> Partition | None:
        """With `sdk` precedence, the partition the other list's patterns give a file as well: the CDM SDK checks
        data and incremental patterns each against its own list, so a file both kinds find is listed in both
        (in a list that names it already, it is not listed again). None with `spec` precedence: one partition."""
        if not self.first_wins:
            return None
        listed = set(self._lists.get(normalize_location(relative_path), ()))
        if not found.explicit:
            listed.add(found.incremental_type is not None)
        for pattern in self.patterns:  # the first of the other list's patterns that matches
            if (pattern.incremental_type is not None) not in listed:
                partition = self._match(pattern, relative_path)
                if partition is not None:
                    return partition
        return None

    def _match(self, pattern: Pattern, relative_path: str) -> Partition | None:
        try:
            return match_pattern(pattern, relative_path)
        except TimeoutError:
            self.timed_out[relative_path] = pattern.name
            _log.warning("pattern.timed_out", pattern=pattern.name, file=relative_path, limit_s=MATCH_TIME_LIMIT_S)
            return None


def match_pattern(pattern: Pattern, relative_path: str) -> Partition | None:
    root = pattern.root_location.rstrip("/")
    rel = "/" + normalize_location(relative_path)
    root_norm = "/" + normalize_location(root) if normalize_location(root) else ""
    if root_norm and not rel.startswith(root_norm + "/"):
        return None
    file_name = rel[len(root_norm) :]
    m = pattern.fullmatch(file_name)  # TimeoutError past the limit
    if m is None:
        return None
    args: dict[str, list[str]] = {}
    for i in range(1, (pattern.expression.groups or 0) + 1):
        value = m.group(i)
        if value is None or i > len(pattern.parameters):
            break
        args.setdefault(pattern.parameters[i - 1], []).append(value)
    return Partition(root + file_name, args, pattern.incremental_type, pattern.name, False)


class Siblings:
    """The other local entities of the manifest: a file one of them takes is theirs, not unmatched (every entity
    of a CDM folder sees every file landing in it). Their patterns are compiled on the first unmatched file."""

    def __init__(self, doc: dict[str, Any], own: str) -> None:
        self._entities = [e for e in doc.get("entities") or () if e.get("entityName") != own
                          and e.get("type", "LocalEntity") == "LocalEntity"]
        self._discoveries: list[Discovery] | None = None

    def take(self, relative: str) -> bool:
        if self._discoveries is None:
            self._discoveries = [Discovery.from_entity(e) for e in self._entities]
        return any(d.match(relative) is not None or normalize_location(relative) in d.invalid
                   for d in self._discoveries)


def discover(discovery: Discovery, siblings: Siblings, relative: str, path: str, log_: Any) -> Partition | None:
    """A landed file's partition (None: not the entity's), logged as found, left to a sibling entity, or unmatched
    with the reason."""
    partition = discovery.match(relative)
    invalid = discovery.invalid.get(normalize_location(relative))
    if invalid is not None:
        log_.warning("file.unmatched", file=path, relative=relative, reason=invalid)
    elif partition is None and siblings.take(relative):
        log_.debug("file.sibling", file=path, relative=relative)  # another entity of the folder's
    elif partition is None and relative in discovery.timed_out:
        log_.warning("file.unmatched", file=path, relative=relative,
                     reason=f"pattern {discovery.timed_out[relative]!r} took longer than the time limit "
                            f"({MATCH_TIME_LIMIT_S:g} s) to match it; simplify the pattern, then land it again")
    elif partition is None:
        log_.warning("file.unmatched", file=path, relative=relative,
                     reason="no partition pattern or explicit partition of the entity matches it")
    else:
        log_.info("file.discovered", file=path, location=partition.location,
                  arguments=partition.arguments, incremental=partition.incremental_type)
    return partition
