"""An HTTP server (aiohttp) on its own thread and event loop.

The intake process serves the daemon's port with it (push API, and the rest passed through);
the daemon process serves health, metrics, status and webhooks with it on a unix socket. Starting
fails with one clear line when the address cannot be bound (port in use, bad TLS files).
`publish` writes the bound address to `state_dir/http.json`, so the CLI can find a daemon
started with `port: 0`, and the token of the operator's requests to `state_dir/admin.token`.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import threading
from pathlib import Path

from aiohttp import web

from lakefeed import log
from lakefeed.config.model import HttpConfig
from lakefeed.errors import TerminalError

_log = log.get(__name__)
ADMIN_TOKEN_FILE = "admin.token"  # noqa: S105 - a file name in the state folder, not a secret


class HttpServer:
    def __init__(self, cfg: HttpConfig, routes: list[web.RouteDef], unix: str | None = None) -> None:
        self.cfg = cfg
        self.unix = unix  # listen on this unix socket ("\0name": abstract) instead of cfg's host:port, without TLS
        self.app = web.Application(client_max_size=cfg.max_body_bytes)
        self.app.add_routes(routes)
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def start(self) -> str:
        """Bind and serve; return the base URL."""
        context = None if self.unix else self._tls()
        # Bodies stay as sent: the push API inflates them itself, bounded (intake/records.py: inflate).
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False, shutdown_timeout=5.0,
                                     auto_decompress=False)
        where = f"unix socket {self.unix!r}" if self.unix else f"{self.cfg.host}:{self.cfg.port}"
        try:
            self._loop.run_until_complete(self._runner.setup())
            site = web.UnixSite(self._runner, self.unix) if self.unix else \
                web.TCPSite(self._runner, self.cfg.host, self.cfg.port, ssl_context=context, reuse_address=True)
            self._loop.run_until_complete(site.start())
        except OSError as exc:
            self._loop.run_until_complete(self._runner.cleanup())
            raise TerminalError(f"cannot listen on {where}: {exc.strerror or exc} "
                                "(another process has the port? set http.port)") from exc
        if self.unix:
            self.url = f"unix:{self.unix!r}"
        else:
            host, port = self._runner.addresses[0][:2]
            self.url = f"{'https' if context else 'http'}://{host}:{port}"
        self._thread = threading.Thread(target=self._loop.run_forever, name="http", daemon=True)
        self._thread.start()
        _log.info("http.listening", url=self.url)
        return self.url

    def _tls(self) -> ssl.SSLContext | None:
        if self.cfg.tls_cert is None or self.cfg.tls_key is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.cfg.tls_cert, self.cfg.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise TerminalError(f"cannot load TLS certificate {self.cfg.tls_cert} / key {self.cfg.tls_key}: "
                                f"{exc}") from exc
        return context

    def stop(self, timeout: float = 15.0) -> None:
        if self._runner is None or self._thread is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        future.result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._loop.close()
        _log.info("http.stopped", url=self.url)


def publish(state_dir: Path, url: str | None, admin_token: str = "") -> None:
    """Write (or with None remove) `state_dir/http.json`, where the daemon with this pid answers, and
    `state_dir/admin.token`, the token its operator's requests (POST /compact) carry: only the daemon's user reads
    that one (0600), while the group that may read the lake may ask for the status."""
    path, token = state_dir / "http.json", state_dir / ADMIN_TOKEN_FILE
    if url is None:
        path.unlink(missing_ok=True)
        token.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = token.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as out:
        out.write(admin_token)
    os.replace(tmp, token)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}), encoding="utf-8")
    os.replace(tmp, path)


def published(state_dir: Path, token: bool = False) -> dict[str, str] | str:
    """What a running daemon published: its `url` (and with `token`, its `admin_token`), or why it cannot be read."""
    path = state_dir / "http.json"
    try:
        found = {"url": str(json.loads(path.read_text(encoding="utf-8"))["url"])}
        if token:
            path = state_dir / ADMIN_TOKEN_FILE
            found["admin_token"] = path.read_text(encoding="utf-8").strip()
        return found
    except FileNotFoundError:
        return f"no running daemon found ({path} is missing); start it"
    except PermissionError:
        return f"cannot read {path}: run this as the daemon's user"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"cannot read {path} ({exc}); is the daemon running?"
