"""A live server in a background thread, and raw HTTP helpers that see the wire format.

Every test module runs its own server on 127.0.0.1 with a free port (``port=0``) over a
``FakeEngine``, so the expected text and token counts follow from ``helios_jax.serve.fake``'s
docstring: in "cycle" mode output token i is ``CYCLE_TEXT[i % 45]``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
from collections.abc import Iterator

from helios_jax.serve.app import HeliosServer, make_server
from helios_jax.serve.fake import FakeEngine
from helios_jax.serve.flags import ServerConfig


@contextlib.contextmanager
def live_server(engine: FakeEngine | None, shutdown_engine: bool = True, **config) -> Iterator[HeliosServer]:
    """A serving HeliosServer (engine None: still starting); shut down on exit, and the engine
    with it unless `shutdown_engine` is False (a module's engine that other tests share)."""
    server = make_server(ServerConfig(port=0, engine="fake", **config), engine)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        if engine is not None and shutdown_engine:
            engine.shutdown()


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)

    def sse_data(self) -> list[str]:
        """The ``data:`` payloads of an event stream, checking the framing on the way: every event
        is one ``data: ...`` line followed by a blank line."""
        text = self.body.decode("utf-8")
        assert text.endswith("\n\n"), text[-50:]
        events = text[:-2].split("\n\n")
        assert all(e.startswith("data: ") and "\n" not in e for e in events), events
        return [e[len("data: ") :] for e in events]


def request(
    server: HeliosServer,
    method: str,
    path: str,
    body=None,
    headers: dict | None = None,
    raw: bytes | None = None,
    timeout: float = 10.0,
) -> Response:
    """One HTTP request on a fresh connection; `body` is JSON-encoded, `raw` sent as is."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=all_headers)
        resp = conn.getresponse()
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def post(server: HeliosServer, path: str, body=None, **kwargs) -> Response:
    return request(server, "POST", path, body, **kwargs)


def get(server: HeliosServer, path: str, **kwargs) -> Response:
    return request(server, "GET", path, **kwargs)


def open_stream(
    server: HeliosServer, path: str, body: dict, read_until: bytes = b"data: "
) -> tuple[socket.socket, bytes]:
    """Send a request on a raw socket and read until `read_until` has arrived twice (or the
    response ends); the caller closes the socket to play a client that goes away."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    data = json.dumps(body).encode()
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    received = b""
    while received.count(read_until) < 2:
        chunk = sock.recv(4096)
        if not chunk:
            break
        received += chunk
    return sock, received


def send_and_hang_up(server: HeliosServer, path: str, body: dict) -> None:
    """Send a complete request and close the connection without reading the answer."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    data = json.dumps(body).encode()
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    sock.close()


def metric_value(text: str, sample: str) -> float:
    """The value of one exposition line, e.g. ``metric_value(t, 'x_total{a="b"}')``."""
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == sample:
            return float(value)
    raise KeyError(sample)
