"""Group commit: whatever push requests are waiting go to the spool in one write + fsync.

Requests come from an asyncio loop (the intake's HTTP server); a group's answers go back to it
in one `call_soon_threadsafe`, so a thousand small requests a second cost the loop one wake-up
per fsync, not one per request.
"""

from __future__ import annotations

import asyncio
import threading

from lakefeed import log
from lakefeed.inbox.spool import Entry, Pending, Spool

_log = log.get(__name__)


class GroupCommit:
    """A thread that appends the requests waiting for the spool in one write + fsync."""

    def __init__(self, spool: Spool, max_bytes: int) -> None:
        self.spool = spool
        self._max_bytes = max_bytes
        self._cond = threading.Condition()
        self._queue: list[tuple[Pending, asyncio.Future[Entry]]] = []
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"spool-{spool.folder.parent.name}", daemon=True)
        self._thread.start()

    async def store(self, item: Pending) -> Entry:
        """The frame's entry, once it is durable."""
        future: asyncio.Future[Entry] = asyncio.get_running_loop().create_future()
        with self._cond:
            if self._stopped:
                raise RuntimeError("the spool is closed")
            self._queue.append((item, future))
            self._cond.notify()
        return await future

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopped:
                    self._cond.wait()
                if not self._queue:
                    return
                batch, self._queue = self._queue, []
            outcome: list[Entry] | Exception
            try:
                outcome = self.spool.append([item for item, _ in batch])
            except Exception as exc:  # the requests get a 500; the thread stays to serve the next ones
                _log.error("spool.write_failed", folder=str(self.spool.folder), error=str(exc))
                outcome = exc
            by_loop: dict[asyncio.AbstractEventLoop, list[int]] = {}
            for i, (_, future) in enumerate(batch):
                by_loop.setdefault(future.get_loop(), []).append(i)
            for loop, indexes in by_loop.items():
                futures = [batch[i][1] for i in indexes]
                results = outcome if isinstance(outcome, Exception) else [outcome[i] for i in indexes]
                try:
                    loop.call_soon_threadsafe(_settle, futures, results)
                except RuntimeError:
                    pass  # that loop is closed: nobody waits for these answers any more

    def full(self) -> bool:
        return self.spool.bytes() >= self._max_bytes

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join()
        self.spool.close()


def _settle(futures: list[asyncio.Future[Entry]], results: list[Entry] | Exception) -> None:
    for i, future in enumerate(futures):
        if future.done():
            continue  # the request was cancelled (client gone); its frame is durable all the same
        if isinstance(results, Exception):
            future.set_exception(results)
        else:
            future.set_result(results[i])
