"""The one interface of the lake's manifests (CDM, MSC, Kartothek, the ODF chain): each is derived from committed
state, so a crash between a commit and its write is repaired by the next refresh."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from lakefeed.config.model import EntityConfig
    from lakefeed.inbox.storage import Storage


class LakeManifest(Protocol):
    def refresh(self) -> object:
        """Bring the manifest up to what is committed (after every batch, and at start)."""

    def check(self) -> list[str]:
        """Where the manifest disagrees with what it describes (`lakefeed verify`); empty when it agrees."""


def manifests_of(cfg: EntityConfig, keeper: LakeManifest, storage: Storage) -> list[LakeManifest]:
    """Every manifest of the entity: the CDM manifest (its keeper), the MSC manifests, the Kartothek metadata
    (these two as the config asks) and the Open Data Fabric chain."""
    from lakefeed.manifests.folders import FolderManifests
    from lakefeed.manifests.kartothek import KartothekDataset
    from lakefeed.odf.chain import OdfChain

    return [keeper, FolderManifests(cfg, storage), KartothekDataset(cfg, storage), OdfChain(cfg, storage)]
