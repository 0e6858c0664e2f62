"""What keeping an MSC manifest current costs (docs/manifests.md): one new version after a batch, against the batch.

A landing folder of `--files` files (1,000 per date folder, as landing folders are laid out) is listed by an MSC
manifest. Then, for each size in `--changes`, k new files land and k/10 of the oldest go (retention). A lakefeed
batch ingests the k files (discover, read, commit to Delta, CDM manifest), the MSC manifest is brought up to
date, and the bench measures:

- `version_over_batch`: the MSC update's time over the batch's (target <= 0.10 at 100k files);
- `version_bytes`: what the new version wrote (new parts and index): it grows with k, not with the files;
- the same run's baselines: MSC's own `ManifestMetadataGenerator` regenerating the manifest from a listing of the
  folder (what a user without lakefeed does), and lakefeed's first, full version.

Then multi-storage-client lists the folder through the manifest, and that listing must equal the folder.
One JSON object goes to stdout.

    python bench/msc_upkeep.py [--files 100000] [--changes 10,100,1000] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import BenchError, Deadline, parse_args, ratio, say  # noqa: E402

from lakefeed.config.manifests import MscManifest  # noqa: E402

SMOKE = {"files": 2000, "changes": "10,100", "repeats": 1}
PER_FOLDER = 1000


def _land(folder: Path, name: str, rows: int = 10) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("id,v\n" + "".join(f"{i},{name}\n" for i in range(rows)))
    return path


def _listing(root: Path) -> dict:
    from lakefeed.manifests.msc import Obj

    out = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for entry in os.scandir(folder):
            st = entry.stat()
            out[f"{folder.name}/{entry.name}"] = Obj.of(st.st_size, st.st_mtime_ns)
    return out


def _files(base: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in base.rglob("*") if p.is_file()}


def _entity(work: Path):
    import yaml

    from lakefeed.config import model as config

    (work / "entity").mkdir()
    doc = {"lake_dir": "lake", "state_dir": "state", "entities": [{
        "name": "bench", "source": {"type": "local_dir", "path": "landing"},
        "patterns": [{"name": "all", "root_location": "data", "glob_pattern": "/*.csv"}],
        "format": {"kind": "csv", "header": True}}]}
    (work / "entity" / "lakefeed.yaml").write_text(yaml.safe_dump(doc))
    (work / "entity" / "landing").mkdir()
    cfg = config.load(work / "entity" / "lakefeed.yaml").entities[0]
    cfg.checkpoint.mkdir(parents=True)
    (cfg.checkpoint / "metadata").write_text(json.dumps({"id": "bench"}))
    return cfg


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=100_000)
    p.add_argument("--changes", default="10,100,1000", help="files landed per batch, comma-separated")
    p.add_argument("--repeats", type=int, default=3, help="batches per size (the median is reported)")
    p.add_argument("--part-lines", type=int, default=MscManifest().part_lines, help="msc part_lines")
    p.add_argument("--timeout", type=float, default=1800.0)
    args = parse_args(p, argv, SMOKE)
    deadline = Deadline(args.timeout if not args.smoke else 300.0)
    import pyarrow.fs as pafs
    from multistorageclient import StorageClient, StorageClientConfig
    from multistorageclient.generators import ManifestMetadataGenerator

    from lakefeed import log
    from lakefeed.inbox.files import FileEvent, Inbox
    from lakefeed.manifests.msc import MscWriter, Obj
    from lakefeed.pipeline.entity import EntityPipeline
    from lakefeed.pipeline.sinks import Sinks

    log.configure("WARNING")  # on stderr: stdout is the report's
    report: dict = {"bench": "msc_upkeep", "smoke": args.smoke, "files": args.files, "part_lines": args.part_lines,
                    "cpus": os.cpu_count(),
                    "loadavg_start": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory(prefix="lakefeed-msc-") as tmp:
        work = Path(tmp)
        landing = work / "landing"
        say(f"landing {args.files} files")
        for i in range(args.files):
            folder = landing / f"d={i // PER_FOLDER:05d}"
            if i % PER_FOLDER == 0:
                folder.mkdir(parents=True)
            (folder / f"f{i:07d}.csv").write_bytes(b"id\n1\n")
        deadline.check("landing the files")

        def client(base: Path, manifest: str | None) -> StorageClient:
            profile: dict = {"storage_provider": {"type": "file", "options": {"base_path": str(base)}}}
            if manifest:
                profile["metadata_provider"] = {"type": "manifest", "options": {"manifest_path": manifest}}
            return StorageClient(StorageClientConfig.from_dict({"profiles": {"p": profile}}, profile="p"))

        generate = []
        for n in range(args.repeats):
            out = work / f"generated-{n}"
            out.mkdir()
            started = time.perf_counter()
            ManifestMetadataGenerator.generate_and_write_manifest(client(landing, None), client(out, None))
            generate.append(time.perf_counter() - started)
        report["msc_generator"] = {"median_s": round(statistics.median(generate), 4),
                                   "bytes": sum(p.stat().st_size for p in (work / "generated-0").rglob("*")
                                                if p.is_file())}
        say(f"MSC's generator: {report['msc_generator']['median_s']} s, {report['msc_generator']['bytes']} bytes")
        deadline.check("MSC's generator")

        writer = MscWriter(pafs.LocalFileSystem(), str(landing), MscManifest(enabled=True, part_lines=args.part_lines))
        started = time.perf_counter()
        writer.update(_listing(landing), (), 0)
        report["first_version_s"] = round(time.perf_counter() - started, 4)

        cfg = _entity(work)
        pipeline = EntityPipeline(cfg, Sinks.of(cfg))
        pipeline.prepare()
        inbox = Inbox(cfg.state / "inbox")
        oldest = sorted(_listing(landing))
        sizes, batch_id, applied = {}, 0, 0
        for k in (int(x) for x in args.changes.split(",")):
            runs = []
            for n in range(args.repeats):
                deadline.check(f"batches of {k}")
                names = [f"new-{k}-{n}/g{i:06d}.csv" for i in range(k)]
                data = [_land(cfg.source.path / "data", f"b{batch_id}-{i}.csv") for i in range(k)]
                started = time.perf_counter()
                pipeline.process(inbox.offer([FileEvent.of(path) for path in data]), batch_id)
                batch_s = time.perf_counter() - started
                batch_id += 1
                put = {}
                for name in names:
                    path = _land(landing, name, rows=1)
                    st = path.stat()
                    put[name] = Obj.of(st.st_size, st.st_mtime_ns)
                gone, oldest = oldest[:k // 10], oldest[k // 10:]
                for key in gone:
                    (landing / key).unlink()
                applied += 1
                before = _files(landing / ".msc_manifests")
                started = time.perf_counter()
                writer.update(put, gone, applied)
                update_s = time.perf_counter() - started
                written = sum(size for path, size in _files(landing / ".msc_manifests").items() if path not in before)
                runs.append((update_s, batch_s, written))
            update_s, batch_s, written = (statistics.median(r[i] for r in runs) for i in range(3))
            sizes[str(k)] = {"update_s": round(update_s, 5), "batch_s": round(batch_s, 4),
                             "version_over_batch": ratio(update_s, batch_s, 4), "version_bytes": int(written),
                             "version_bytes_per_change": round(written / (k + k // 10), 1)}
            say(f"{k} changes: version {update_s:.4f} s ({written} bytes), batch {batch_s:.3f} s")
        report["changes"] = sizes
        listed = {o.key for o in client(landing, ".msc_manifests").list("")}
        on_disk = set(_listing(landing))
        report["msc_lists_the_folder"] = listed == on_disk
        if listed != on_disk:
            raise BenchError(f"MSC lists {len(listed)} keys, the folder holds {len(on_disk)}")
        report["generator_over_version"] = {k: ratio(report["msc_generator"]["median_s"], v["update_s"], 1)
                                            for k, v in sizes.items()}
        smallest = sizes[min(sizes, key=int)]
        report["smallest_version_over_full_bytes"] = ratio(smallest["version_bytes"],
                                                           report["msc_generator"]["bytes"], 4)
        report["targets"] = {"version_over_batch_max": 0.10,
                             "met": all(v["version_over_batch"] <= 0.10 for v in sizes.values())}
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report["ok"] = True
    return report


if __name__ == "__main__":
    try:
        result = main()
    except BenchError as exc:
        result = {"bench": "msc_upkeep", "error": str(exc)}
    print(json.dumps(result))
    sys.exit(0 if "error" not in result else 1)
