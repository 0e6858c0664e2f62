"""Where a micro-batch ends in its source, as the ODF chain records it (`newSourceState` of the batch's AddData
block): the inbox offset of a file batch, the spool offset of a push batch, each Kafka partition's next offset."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

SOURCE_STATE_KEY = "lakefeed.source_state"  # changelog commit metadata: one of these, as JSON


def of_files(stream: str, offsets: Sequence[int]) -> dict[str, str]:
    return {"source": stream, "kind": "lakefeed/inbox-offset", "value": str(max(offsets) + 1)}


def of_frames(stream: str, last_offset: int) -> dict[str, str]:
    return {"source": stream, "kind": "lakefeed/spool-offset", "value": str(last_offset + 1)}


def message_ends(batch: pa.Table) -> dict[str, dict[str, int]]:
    """`{topic: {partition: next offset}}` of some messages (a task's part of a batch); {} without coordinates."""
    if not {"topic", "partition", "offset"} <= set(batch.column_names) or batch.num_rows == 0:
        return {}
    last = batch.group_by(["topic", "partition"]).aggregate([("offset", "max")])
    ends: dict[str, dict[str, int]] = {}
    for topic, partition, offset in zip(last.column("topic").to_pylist(), last.column("partition").to_pylist(),
                                        pc.add(last.column("offset_max"), 1).to_pylist(), strict=True):
        ends.setdefault(str(topic), {})[str(partition)] = offset
    return ends


def of_messages(stream: str, parts: Sequence[dict[str, dict[str, int]]]) -> dict[str, str] | None:
    """Where a Kafka batch ends, from its parts' `message_ends`; None when they carry no coordinates."""
    ends: dict[str, dict[str, Any]] = {}
    for part in parts:
        for topic, partitions in part.items():
            for partition, offset in partitions.items():
                known = ends.setdefault(topic, {})
                known[partition] = max(offset, known.get(partition, offset))
    if not ends:
        return None
    value = json.dumps({t: dict(sorted(p.items(), key=lambda kv: int(kv[0]))) for t, p in sorted(ends.items())})
    return {"source": stream, "kind": "lakefeed/kafka-offsets", "value": value}
