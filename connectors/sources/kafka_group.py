"""The consumer group's offsets that the Kafka source mirrors (`group_id`), for outside lag tools only: the
query's own offsets are in its checkpoint, and nothing reads these back."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from lakefeed import log

_log = log.get(__name__)


class GroupOffsets:
    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self._stored: Mapping[tuple[str, int], int] | None = None  # as last stored
        self._failing = False

    def store(self, offsets: Mapping[tuple[str, int], int], client: Callable[[], KafkaConsumer],
              close: Callable[[], None]) -> None:
        """Store `offsets` unless they are stored already. A failure never fails or holds up the query: it is
        logged once (`kafka.group_commit_failed`), and the next call tries again; `close` drops the client."""
        if offsets == self._stored:
            return
        try:
            client().commit({TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()},
                            timeout_ms=5000)
        except KafkaError as e:
            if not self._failing:
                _log.warning("kafka.group_commit_failed", group_id=self.group_id, error=repr(e),
                             then="tried again at the next trigger")
            self._failing = True
            close()
            return
        if self._failing:
            _log.info("kafka.group_committed", group_id=self.group_id)
        self._stored, self._failing = dict(offsets), False
