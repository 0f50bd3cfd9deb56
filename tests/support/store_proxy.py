"""An HTTP proxy in front of the S3 API that can answer errors: an object store's outage, as its
clients see it (``503 SlowDown`` to every request), without losing what the store holds.

Requests are forwarded as they came (method, path, headers, body) to the upstream server and its
answer returned whole; while :meth:`StoreProxy.failing` is set, every request gets a 503 instead.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import threading
from typing import Any

ERROR_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (a timeout, a cancelled read) is not the proxy's error."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class StoreProxy:
    """Listens on ``127.0.0.1:port`` and forwards to ``127.0.0.1:upstream``."""

    def __init__(self, port: int, upstream: int) -> None:
        self.port, self.upstream = port, upstream
        self.failing = threading.Event()
        self.refused = 0
        self._server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> StoreProxy:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if proxy.failing.is_set():
                    proxy.refused += 1
                    self._answer(503, {"Content-Type": "application/xml", "Retry-After": "1"}, ERROR_BODY)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    head = self.command == "HEAD"  # its Content-Length is the object's, with no body
                    kept = {
                        k: v
                        for k, v in resp.getheaders()
                        if k.lower() not in ("transfer-encoding", "connection")
                        and (head or k.lower() != "content-length")
                    }
                    self._answer(resp.status, kept, b"" if head else data, length=not head)
                finally:
                    conn.close()

            def _answer(self, status: int, headers: dict[str, str], data: bytes, length: bool = True) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                if length:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a client that read enough
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

            def log_message(self, *args: Any) -> None:
                pass

        self._server = _QuietServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
