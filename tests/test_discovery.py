from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakefeed.batch.discovery import (
    Discovery,
    Partition,
    argument_clash,
    glob_to_regex,
    match_pattern,
    pattern_from_json,
)
from tests import cdm_sdk


def _entity(data=(), incremental=(), partitions=(), incremental_partitions=()):
    return {"entityName": "e", "dataPartitionPatterns": list(data), "incrementalPartitionPatterns": list(incremental),
            "dataPartitions": list(partitions), "incrementalPartitions": list(incremental_partitions)}


def test_seed_example_regex_with_parameters():
    d = Discovery.from_entity(_entity([{"name": "p", "rootLocation": "FullData",
                                        "regularExpression": r"/(\d{4})/(\w+)/cohort(\d+)\.csv$",
                                        "parameters": ["year", "month", "cohortNumber"]}]))
    p = d.match("FullData/2015/May/cohort001.csv")
    assert p == Partition("FullData/2015/May/cohort001.csv", {"year": ["2015"], "month": ["May"],
                                                              "cohortNumber": ["001"]}, None, "p", False)
    assert d.match("FullData/2015/May/cohort001.csv.backup") is None
    assert d.match("Other/2015/May/cohort001.csv") is None


def test_regex_is_a_full_match_on_the_path_with_leading_slash():
    d = Discovery.from_entity(_entity([{"name": "p", "rootLocation": "data/", "regularExpression": r"[a-z]+\.csv"}]))
    assert d.match("data/a.csv") is None  # "/a.csv" does not fully match "[a-z]+\.csv"
    d = Discovery.from_entity(_entity([{"name": "p", "rootLocation": "data/", "regularExpression": r"/[a-z]+\.csv"}]))
    assert d.match("data/a.csv").location == "data/a.csv"
    assert d.match("data/sub/a.csv") is None


def test_incremental_pattern_carries_its_type_and_root_keeps_its_slash():
    d = Discovery.from_entity(_entity(incremental=[{
        "name": "UpsertPattern", "rootLocation": "/IncrementalData",
        "regularExpression": r"/(.*)/(.*)/(.*)/Upserts/(\d+)\.csv$",
        "parameters": ["year", "month", "day", "upsertPartitionNumber"],
        "exhibitsTraits": [{"traitReference": "is.partition.incremental",
                            "arguments": [{"name": "type", "value": "Upsert"}]}]}]))
    p = d.match("IncrementalData/2018/8/15/Upserts/1.csv")
    assert p.location == "/IncrementalData/2018/8/15/Upserts/1.csv"
    assert p.incremental_type == "Upsert" and p.pattern_name == "UpsertPattern"
    assert p.arguments == {"year": ["2018"], "month": ["8"], "day": ["15"], "upsertPartitionNumber": ["1"]}


def test_arguments_stop_at_first_group_that_did_not_take_part():
    pattern = pattern_from_json({"name": "p", "regularExpression": r"/(a)?(b)?(c)", "parameters": ["x", "y", "z"]},
                                False)
    assert match_pattern(pattern, "bc").arguments == {}
    assert match_pattern(pattern, "abc").arguments == {"x": ["a"], "y": ["b"], "z": ["c"]}
    assert match_pattern(pattern, "ac").arguments == {"x": ["a"]}


def test_repeated_group_keeps_last_capture_and_extra_groups_without_parameters_are_ignored():
    pattern = pattern_from_json({"name": "p", "regularExpression": r"/(?:(\w)/)+(\w+)\.csv", "parameters": ["d"]},
                                False)
    assert match_pattern(pattern, "a/b/c/f.csv").arguments == {"d": ["c"]}


def test_glob_is_preferred_over_regex_when_both_are_set():
    d = Discovery.from_entity(_entity([{"name": "p", "globPattern": "/*.csv", "regularExpression": r"/.*\.txt"}]))
    assert d.match("a.csv") is not None
    assert d.match("a.txt") is None


def test_glob_translation():
    assert re.fullmatch(glob_to_regex("*.csv"), "/a.csv")
    assert not re.fullmatch(glob_to_regex("*.csv"), "/x/a.csv")
    assert re.fullmatch(glob_to_regex("/**/*.csv"), "/x/y/a.csv")
    assert re.fullmatch(glob_to_regex("/x/**/a.csv"), "/x/a.csv")
    assert re.fullmatch(glob_to_regex("/x/**/a.csv"), "/x/y/z/a.csv")
    assert re.fullmatch(glob_to_regex("/a?.csv"), "/ab.csv")
    assert re.fullmatch(glob_to_regex("/a+b(1).csv"), "/a+b(1).csv")  # literal, unlike the SDK


def test_last_matching_pattern_wins_and_explicit_partitions_are_never_overwritten():
    entity = _entity(
        [{"name": "first", "regularExpression": r"/(\w+)/.*", "parameters": ["a"]},
         {"name": "second", "regularExpression": r"/\w+/(\w+)\.csv", "parameters": ["b"]}],
        partitions=[{"location": "x/listed.csv", "arguments": [{"name": "k", "value": "v"}]}],
    )
    d = Discovery.from_entity(entity)
    assert d.match("x/y.csv").pattern_name == "second"
    assert d.match("x/y.txt").pattern_name == "first"
    listed = d.match("x/listed.csv")
    assert listed.explicit and listed.arguments == {"k": ["v"]}
    # Once lakefeed wrote that location itself, it is inferred again.
    assert Discovery.from_entity(entity, owned={"x/listed.csv"}).match("x/listed.csv").pattern_name == "second"


def test_a_data_column_named_like_a_partition_argument_is_a_clash_naming_both():
    entity = _entity([{"name": "byYear", "regularExpression": r"/(\d{4})/.*", "parameters": ["year"]}],
                     partitions=[{"location": "listed.csv", "arguments": [{"name": "region", "value": "eu"}]}])
    d = Discovery.from_entity(entity)
    assert argument_clash(d.match("2024/a.csv"), ["id", "amount"]) is None
    reason = argument_clash(d.match("2024/a.csv"), ["id", "year"])
    assert "'year'" in reason and "pattern 'byYear'" in reason and "rename the pattern's parameter" in reason
    listed = argument_clash(d.match("listed.csv"), ["region"])
    assert "'region'" in listed and "listed for the file in the manifest" in listed


def test_invalid_patterns_are_skipped():
    d = Discovery.from_entity(_entity(
        [{"name": "bad", "regularExpression": "(["},
         {"name": "incr", "regularExpression": ".*", "exhibitsTraits": ["is.partition.incremental"]}],
        incremental=[{"name": "notype", "regularExpression": ".*"}]))
    assert d.patterns == ()


# --- model-based: against a reference model, and against Microsoft's CDM SDK ---------------------

SEGMENTS = ["2024", "01", "x", "ab"]
NAMES = ["a.csv", "b.txt", "c1.csv", "2023.csv"]
ROOTS = ["", "data", "data/2024", "/data"]
REGEXES = [
    (r"/(\d{4})/(\d{2})/([a-z0-9]+)\.csv", ["year", "month", "name"]),
    (r".+\.csv", []),
    (r"/(\w+)/(.*)", ["first", "rest"]),
    (r"/(\d+)?/?([a-z0-9]+)\.(\w+)", ["num", "name", "ext"]),
    (r"/(?:(\w+)/)*(\w+)\.txt", ["dir", "file"]),
]
GLOBS = ["/*.csv", "**/*.csv", "/*/*.csv", "*.txt", "/**/2024/*"]

paths = st.lists(
    st.tuples(st.sampled_from(["data", ""]), st.lists(st.sampled_from(SEGMENTS), max_size=3),
              st.sampled_from(NAMES)).map(lambda t: "/".join(p for p in (t[0], *t[1], t[2]) if p)),
    min_size=1, max_size=8, unique=True)


@st.composite
def pattern_json(draw, name, roots=ROOTS):
    root = draw(st.sampled_from(roots))
    if draw(st.booleans()):
        regex, params = draw(st.sampled_from(REGEXES))
        return {"name": name, "rootLocation": root, "regularExpression": regex, "parameters": params}
    return {"name": name, "rootLocation": root, "globPattern": draw(st.sampled_from(GLOBS))}


def reference(files, patterns, explicit, first_wins=False):
    """The spec's rules (or, `first_wins`, the SDK's precedence) written as plainly as possible."""
    out = {}
    for f in files:
        if f in explicit:
            out[f] = ("explicit", explicit[f])
            continue
        for p in patterns:  # later patterns overwrite earlier ones
            root = p["rootLocation"].strip("/")
            if root and not f.startswith(root + "/"):
                continue
            name = "/" + f[len(root) + 1:] if root else "/" + f
            regex = glob_to_regex(p["globPattern"]) if p.get("globPattern") else p["regularExpression"]
            m = re.fullmatch(regex, name)
            if m:
                args = {}
                for i, param in enumerate(p.get("parameters", []), start=1):
                    if i > (m.re.groups or 0) or m.group(i) is None:
                        break
                    args[param] = [m.group(i)]
                out[f] = (p["name"], args)
                if first_wins:
                    break
    return out


@settings(max_examples=150, deadline=None)
@given(files=paths, patterns=st.lists(st.integers(0, 10**6), min_size=1, max_size=4).flatmap(
    lambda ids: st.tuples(*[pattern_json(f"p{i}") for i in range(len(ids))])), data=st.data())
def test_discovery_matches_reference_model(files, patterns, data):
    explicit_files = data.draw(st.lists(st.sampled_from(files), unique=True, max_size=2))
    explicit = {f: {"k": [f]} for f in explicit_files}
    entity = _entity(list(patterns), partitions=[{"location": f, "arguments": [{"name": "k", "value": f}]}
                                                 for f in explicit_files])
    for precedence in ("spec", "sdk"):
        d = Discovery.from_entity(entity, precedence=precedence)
        got = {}
        for f in files:
            p = d.match(f)
            if p is not None:
                got[f] = ("explicit" if p.explicit else p.pattern_name, p.arguments)
        assert got == reference(files, list(patterns), explicit, first_wins=precedence == "sdk"), precedence


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=paths, patterns=st.lists(pattern_json("p", roots=[r for r in ROOTS if r]), min_size=1, max_size=3))
def test_with_sdk_precedence_discovery_agrees_with_microsoft_cdm_sdk(files, patterns):
    """Several data patterns (the SDK requires a root), `pattern_precedence: sdk`: same partitions, same
    arguments, the same pattern for each file."""
    patterns = [{**p, "name": f"p{i}"} for i, p in enumerate(patterns)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for f in files:
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            (root / f).write_text("x\n")
        manifest = {"manifestName": "default", "jsonSchemaSemanticVersion": "1.0.0",
                    "entities": [{"type": "LocalEntity", "entityName": "e", "entityPath": "e.cdm.json/e",
                                  "dataPartitionPatterns": patterns}]}
        (root / "default.manifest.cdm.json").write_text(json.dumps(manifest))
        sdk, _ = cdm_sdk.partitions(root, status_check=True)
        expected = {loc.lstrip("/"): args for (loc, _), args in sdk["e"].items()
                    if not loc.endswith(".cdm.json")}
    d = Discovery.from_entity(manifest["entities"][0], precedence="sdk")
    got = {}
    for f in files:
        p = d.match(f)
        if p is not None:
            got[p.location.lstrip("/")] = p.arguments
    assert got == expected


def test_sdk_comparison_is_not_vacuous(tmp_path):
    for f in ["data/2024/01/a.csv", "data/x/b.txt"]:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("x\n")
    pattern = {"name": "only", "rootLocation": "data", "regularExpression": r"/(\w+)/(.*)", "parameters": ["a", "b"]}
    (tmp_path / "default.manifest.cdm.json").write_text(json.dumps(
        {"manifestName": "default", "jsonSchemaSemanticVersion": "1.0.0",
         "entities": [{"type": "LocalEntity", "entityName": "e", "entityPath": "e.cdm.json/e",
                       "dataPartitionPatterns": [pattern]}]}))
    sdk, _ = cdm_sdk.partitions(tmp_path, status_check=True)
    assert sdk["e"] == {("data/2024/01/a.csv", False): {"a": ["2024"], "b": ["01/a.csv"]},
                        ("data/x/b.txt", False): {"a": ["x"], "b": ["b.txt"]}}
    d = Discovery.from_entity({"dataPartitionPatterns": [pattern]})
    assert d.match("data/2024/01/a.csv").arguments == {"a": ["2024"], "b": ["01/a.csv"]}
