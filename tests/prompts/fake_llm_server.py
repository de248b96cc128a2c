"""A real HTTP server on a free loopback port that speaks the chat-completions protocol.

Each test scripts the answers, one per request (the last one repeats), and reads back
what the server received. Slow answers ("hang", "trickle") wait on ``release`` so
that closing the server never waits on them.
"""

from __future__ import annotations

import json
import select
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: bytes | dict | None = None
    headers: dict[str, str] = field(default_factory=dict)
    sse: list[str] | None = None  # data: payloads, streamed as server-sent events
    hang: bool = False  # accept the request, then send nothing
    trickle: bool = False  # send headers, then one byte at a time, forever


def completion(text: str) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}  # fmt: skip


def chunk(text: str, finish: str | None = None) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]})


def _hung_up(connection: socket.socket) -> bool:
    """Whether the client closed its end. Checked for every open request when a new one
    arrives: a client that gives up a call closes its socket before starting its next
    call, so the peak counts no call given up, however late a slow poll notices it."""
    try:
        return connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeLLM:
    def __init__(self) -> None:
        self.replies: list[Reply] = [Reply(body=completion("ok"))]
        self.received: list[Received] = []
        self.release = threading.Event()
        self.in_flight = 0  # requests being answered now
        self.peak_in_flight = 0  # the most requests answered at once whose clients were still waiting
        self._count_lock = threading.Lock()
        self._answering: set[socket.socket] = set()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length)
                fake.received.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()},
                                              json.loads(raw)))  # fmt: skip
                index = min(len(fake.received), len(fake.replies)) - 1
                with fake._count_lock:
                    fake.in_flight += 1
                    fake._answering = {c for c in fake._answering if not _hung_up(c)}
                    fake._answering.add(self.connection)
                    fake.peak_in_flight = max(fake.peak_in_flight, len(fake._answering))
                try:
                    fake.serve(self, fake.replies[index])
                finally:
                    with fake._count_lock:
                        fake.in_flight -= 1
                        fake._answering.discard(self.connection)

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # many clients connecting at once are queued, not refused

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def script(self, *replies: Reply) -> None:
        self.replies = list(replies)

    def serve(self, handler: BaseHTTPRequestHandler, reply: Reply) -> None:
        if reply.hang:  # until released, or until the client gives up and closes
            while not self.release.wait(0.05):
                readable, _, _ = select.select([handler.connection], [], [], 0)
                if readable and not handler.connection.recv(1, socket.MSG_PEEK):
                    return
            return
        if reply.trickle:
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", "1000000")
            handler.end_headers()
            while not self.release.wait(0.02):
                try:
                    handler.wfile.write(b" ")
                    handler.wfile.flush()
                except OSError:
                    return
            return
        if reply.sse is not None:
            payload = "".join(f"data: {data}\n\n" for data in reply.sse).encode()
            content_type = "text/event-stream"
        elif isinstance(reply.body, dict):
            payload, content_type = json.dumps(reply.body).encode(), "application/json"
        else:
            payload, content_type = reply.body or b"", "application/json"
        handler.send_response(reply.status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(payload)))
        for key, value in reply.headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(payload)

    def __enter__(self) -> FakeLLM:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
