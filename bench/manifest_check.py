"""What `lakefeed manifest check` costs on a CDM folder, against the CDM SDK and against the bare file system.

A folder of `--files` CSV files in day folders (`data/YYYY/MM/DD/`, 1,000 per folder) and a root manifest whose
entity has one data partition pattern capturing year, month and day. In the same run, the bench measures:

- `floor_s`: `os.walk` + `os.stat` of every file (what any check has to do at least);
- `lakefeed.first_s`: `lakefeed manifest check` (in process) finding every partition and writing the manifest;
- `lakefeed.recheck_s`: the same check again, with nothing changed (nothing is rewritten);
- `sdk.check_s` and `sdk.save_s`: Microsoft's CDM SDK, `fileStatusCheckAsync(FULL)` and `saveAsAsync`;
- ratios: `first_over_floor` (goal <= 2), `recheck_over_floor`, `sdk_over_lakefeed`.

Both write the same partitions (the bench checks the counts). One JSON object goes to stdout.

    python bench/manifest_check.py [--files 10000,100000] [--repeats 3] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import BenchError, Deadline, parse_args, ratio, say  # noqa: E402

SMOKE = {"files": "2000", "repeats": 1}
PER_FOLDER = 1000
MANIFEST = {
    "manifestName": "default", "jsonSchemaSemanticVersion": "1.0.0",
    "entities": [{"type": "LocalEntity", "entityName": "Events", "entityPath": "Events.cdm.json/Events",
                  "dataPartitionPatterns": [{
                      "name": "daily", "rootLocation": "data", "parameters": ["year", "month", "day"],
                      "regularExpression": "/(\\d{4})/(\\d{2})/(\\d{2})/[^/]+\\.csv",
                      "exhibitsTraits": [{"traitReference": "is.partition.format.CSV",
                                          "arguments": [{"name": "columnHeaders", "value": "true"}]}]}]}]}


def _land(root: Path, files: int) -> None:
    for i in range(files):
        day = i // PER_FOLDER
        folder = root / "data" / f"{2000 + day // 336:04d}" / f"{day // 28 % 12 + 1:02d}" / f"{day % 28 + 1:02d}"
        if i % PER_FOLDER == 0:
            folder.mkdir(parents=True)
        (folder / f"part-{i:07d}.csv").write_bytes(b"id\n1\n")


def _floor(root: Path) -> float:
    started = time.perf_counter()
    n = 0
    for folder, _, names in os.walk(root / "data"):
        for name in names:
            os.stat(os.path.join(folder, name))
            n += 1
    return time.perf_counter() - started


def _fresh_manifest(root: Path) -> Path:
    path = root / "default.manifest.cdm.json"
    path.write_text(json.dumps(MANIFEST))
    return path


def _partitions(path: Path) -> int:
    return len(json.loads(path.read_text())["entities"][0].get("dataPartitions", []))


def _sdk(root: Path) -> tuple[float, float, int]:
    from cdm.enums import PartitionFileStatusCheckType
    from cdm.objectmodel import CdmCorpusDefinition
    from cdm.storage import LocalAdapter

    async def run() -> tuple[float, float, int]:
        corpus = CdmCorpusDefinition()
        corpus.storage.mount("local", LocalAdapter(str(root)))
        corpus.storage.default_namespace = "local"
        manifest = await corpus.fetch_object_async("local:/default.manifest.cdm.json")
        started = time.perf_counter()
        await manifest.file_status_check_async(PartitionFileStatusCheckType.FULL)
        checked = time.perf_counter()
        await manifest.save_as_async("sdk.manifest.cdm.json")
        return checked - started, time.perf_counter() - checked, len(manifest.entities[0].data_partitions)

    return asyncio.run(run())


def measure(work: Path, files: int, repeats: int, sdk: bool, deadline: Deadline) -> dict:
    from lakefeed.manifests.cdm_check import check

    root = work / f"folder-{files}"
    say(f"landing {files} files")
    _land(root, files)
    floors, firsts, rechecks = [], [], []
    for _ in range(repeats):
        deadline.check(f"checks at {files} files")
        floors.append(_floor(root))
        path = _fresh_manifest(root)
        firsts.append(check(path).seconds)
        if _partitions(path) != files:
            raise BenchError(f"lakefeed found {_partitions(path)} partitions of {files} files")
        stamp = path.stat().st_mtime_ns
        report = check(path)
        if report.manifests[0]["written"] or path.stat().st_mtime_ns != stamp:
            raise BenchError("a re-check with nothing changed rewrote the manifest")
        rechecks.append(report.seconds)
    out: dict = {"floor_s": round(statistics.median(floors), 4),
                 "lakefeed": {"first_s": round(statistics.median(firsts), 4),
                              "recheck_s": round(statistics.median(rechecks), 4),
                              "manifest_bytes": (root / "default.manifest.cdm.json").stat().st_size}}
    out["first_over_floor"] = ratio(out["lakefeed"]["first_s"], out["floor_s"], 2)
    out["recheck_over_floor"] = ratio(out["lakefeed"]["recheck_s"], out["floor_s"], 2)
    say(f"{files} files: floor {out['floor_s']} s, lakefeed {out['lakefeed']['first_s']} s first, "
        f"{out['lakefeed']['recheck_s']} s again")
    if sdk:
        deadline.check(f"the SDK at {files} files")
        _fresh_manifest(root)
        check_s, save_s, found = _sdk(root)
        if found != files:
            raise BenchError(f"the SDK found {found} partitions of {files} files")
        out["sdk"] = {"check_s": round(check_s, 4), "save_s": round(save_s, 4)}
        out["sdk_over_lakefeed"] = ratio(check_s + save_s, out["lakefeed"]["first_s"], 1)
        say(f"{files} files: SDK {check_s:.3f} s check + {save_s:.3f} s save")
    shutil.rmtree(root)
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", default="10000,100000", help="folder sizes, comma-separated")
    p.add_argument("--repeats", type=int, default=3, help="lakefeed checks per size (the median is reported)")
    p.add_argument("--no-sdk", action="store_true", help="leave the CDM SDK out")
    p.add_argument("--timeout", type=float, default=3600.0)
    args = parse_args(p, argv, SMOKE)
    deadline = Deadline(args.timeout if not args.smoke else 300.0)
    from lakefeed import log

    log.configure("WARNING")  # on stderr: stdout is the report's
    report: dict = {"bench": "manifest_check", "smoke": args.smoke, "cpus": os.cpu_count(),
                    "loadavg_start": [round(x, 2) for x in os.getloadavg()], "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="lakefeed-check-") as tmp:
        for files in (int(x) for x in args.files.split(",")):
            report["sizes"][str(files)] = measure(Path(tmp), files, args.repeats, not args.no_sdk, deadline)
    report["targets"] = {"first_over_floor_max": 2.0,
                         "met": all(v["first_over_floor"] <= 2.0 for v in report["sizes"].values())}
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report["ok"] = True
    return report


if __name__ == "__main__":
    try:
        result = main()
    except BenchError as exc:
        result = {"bench": "manifest_check", "error": str(exc)}
    print(json.dumps(result))
    sys.exit(0 if "error" not in result else 1)
