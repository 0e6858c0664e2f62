"""When an entity's tables have their small files rewritten into larger ones (daemon/pipeline/compaction.py)."""

from __future__ import annotations

from pydantic import Field

from lakefeed.config.base import CENTURY_S, Frozen


class Compaction(Frozen):
    """Each batch adds a file or a few to a table; compacting rewrites the small ones into files of about
    `target_file_mb`, in a commit that changes no row. The changelog is compacted once the ODF chain holds all of
    it: its files are the chain's data slices (daemon/pipeline/compaction.py)."""

    every: int = Field(default=50, ge=0, description="Compact a table (the current state, changelog, quarantine, "
                                                     "history, tombstones) after this many commits to it; 0: only when "
                                                     "asked (`lakefeed compact`).")
    target_file_mb: int = Field(default=128, ge=1, le=4096, description="The size compacted files are aimed at.")
    vacuum_retain_hours: int | None = Field(
        default=168, ge=0, le=int(CENTURY_S // 3600),
        description="With each compaction, the files a table stopped using (compacted, or rewritten by a MERGE) "
                    "this many hours ago are deleted from storage (Delta's VACUUM); time travel reaches back this far. "
                    "null: never.")
