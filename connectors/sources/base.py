"""The contract of a source.

A Source turns what happens outside (a file landing, a notification) into inbox entries;
its resumable position is the inbox offset, kept in Spark's checkpoint.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class Source(ABC):
    """Lifecycle: start() begins delivering to the inbox; stop() stops intake and returns promptly."""

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def reconcile(self) -> int:
        """List what the source holds, enqueue what the inbox has not seen, return how many."""

    def failure(self) -> str | None:
        """Why the source stopped delivering (a thread of it died), or None while it works."""
        return None
