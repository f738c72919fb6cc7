"""One local HTTP server for unit tests of the harness's own HTTP code (the lm-eval request loop,
the deployment-file checks, the external-deployment flow): every request is kept and answered by
a function. Never evidence that P/D works; the real servers are in suites/."""
from __future__ import annotations

import http.server
import json
import threading
from typing import Any, Callable

# respond(request) -> (status, payload) or (status, payload, content type); a str payload is
# sent as it is (default text/plain), anything else as JSON
Responder = Callable[[dict[str, Any]], tuple]


class FakeHttp(http.server.ThreadingHTTPServer):
    """A server on 127.0.0.1 (a free port) until close(); also a context manager.
    ``requests``: every request as {method, path, authorization, body (parsed JSON or None)}."""

    daemon_threads = True

    def __init__(self, respond: Responder) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.respond = respond
        self.requests: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def bodies(self, path: str | None = None) -> list[Any]:
        return [r["body"] for r in self.requests if path is None or r["path"] == path]

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> "FakeHttp":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FakeHttp

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        request = {"method": self.command, "path": self.path,
                   "authorization": self.headers.get("Authorization"),
                   "body": json.loads(raw) if raw else None}
        self.server.requests.append(request)
        status, payload, *rest = self.server.respond(request)
        text = isinstance(payload, str)
        content_type = rest[0] if rest else ("text/plain" if text else "application/json")
        data = (payload if text else json.dumps(payload)).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _handle  # noqa: N815 - http.server's names

    def log_message(self, *args: Any) -> None:
        pass
