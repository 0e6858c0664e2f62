"""Driving Microsoft's CDM SDK (commondatamodel-objectmodel), the reference peer for discovery."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cdm.objectmodel import CdmCorpusDefinition
from cdm.storage import CdmStandardsAdapter, LocalAdapter


def _corpus(root: Path) -> CdmCorpusDefinition:
    corpus = CdmCorpusDefinition()
    corpus.storage.mount("local", LocalAdapter(str(root)))
    corpus.storage.mount("cdm", CdmStandardsAdapter())
    corpus.storage.default_namespace = "local"
    return corpus


async def _load(root: Path, manifest: str, status_check: bool, incremental: bool):
    doc = await _corpus(root).fetch_object_async(f"local:/{manifest}")
    assert doc is not None, f"the CDM SDK could not load {manifest}"
    if status_check:
        from cdm.enums import PartitionFileStatusCheckType

        kind = PartitionFileStatusCheckType.FULL_AND_INCREMENTAL if incremental else PartitionFileStatusCheckType.FULL
        await doc.file_status_check_async(kind)
    return doc


def partitions(root: Path, manifest: str = "default.manifest.cdm.json", status_check: bool = False,
               incremental: bool = False):
    """{entity: {(location, incremental): {argument: [values]}}} as the SDK sees the manifest (after its
    fileStatusCheck of data patterns, and of incremental ones too with `incremental`)."""
    doc = asyncio.run(_load(root, manifest, status_check, incremental))
    out = {}
    for entity in doc.entities:
        found = {}
        for p in entity.data_partitions:
            found[(p.location, False)] = {k: list(v) for k, v in p.arguments.items()}
        for p in entity.incremental_partitions:
            found[(p.location, True)] = {k: list(v) for k, v in p.arguments.items()}
        out[entity.entity_name] = found
    return out, doc


def entity_attributes(root: Path, entity_path: str) -> list[tuple[str, str]]:
    """(name, dataFormat) of the attributes of an entity definition, resolved by the SDK."""

    async def fetch():
        entity = await _corpus(root).fetch_object_async(f"local:/{entity_path}")
        assert entity is not None, f"the CDM SDK could not load {entity_path}"
        return [(a.name, str(a.data_format)) for a in entity.attributes]

    return asyncio.run(fetch())
