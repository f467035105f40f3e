"""One blocking HTTP/1.1 connection: a request written in one ``sendall``, the response read with httptools.

This is the blocking HTTP client's whole wire layer. Measured against the libraries that could do the job (one small
infer to a pyserve server, client CPU per call and p50; benchmarks/bench_client.py --libraries): ``http.client``
90 µs and 0.32 ms (it writes headers and body in two sends and parses headers with the ``email`` package),
urllib3 on top of it 160 µs and 0.42 ms, httpx 400 µs and 0.69 ms; the whole ModelClient on this module 66 µs and
0.27 ms.
"""

from __future__ import annotations

import select
import socket
import ssl
from collections.abc import Callable, Iterator, Mapping

import httptools

_RECV_SIZE = 1 << 16


class ConnectionDropped(ConnectionError):
    """The server closed the connection before sending any of the response (the request may be sent anew)."""


class _Response:
    """httptools callbacks collecting one response (``parser`` is the parser that calls them)."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.headers_done = False
        self.done = False
        self.keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        # Read now: once the message is complete the parser no longer says.
        self.keep_alive = self.parser.should_keep_alive()
        self.done = True


class HttpConnection:
    """A kept-alive HTTP/1.1 connection to one server (not shared by threads at once)."""

    def __init__(self, host: str, port: int, connect_timeout_s: float, tls: ssl.SSLContext | None = None) -> None:
        self._host = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # the Host header
        sock = socket.create_connection((host, port), timeout=connect_timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            try:  # the handshake, within the connection's time limit
                sock = tls.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self._buffer = bytearray(_RECV_SIZE)
        self.keep_alive = True

    def close(self) -> None:
        """Close the socket."""
        self.keep_alive = False
        self.sock.close()

    def is_dropped(self) -> bool:
        """Whether the server closed this idle connection (its socket reads as ready: EOF, or stray bytes)."""
        if self.sock.fileno() < 0:
            return True
        if not isinstance(self.sock, ssl.SSLSocket):
            return bool(select.select([self.sock], [], [], 0)[0])
        if not self.sock.pending() and not select.select([self.sock], [], [], 0)[0]:
            return False
        # Over TLS a readable socket may hold only protocol records (a TLS 1.3 session ticket): read to tell.
        self.sock.setblocking(False)
        try:
            self.sock.recv(1)
        except ssl.SSLWantReadError:
            return False
        except OSError:
            return True
        return True  # end of stream, or bytes nobody asked for

    def send(self, method: str, path: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> None:
        """Write one request."""
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self._host}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self.sock.settimeout(timeout_s)
        self.sock.sendall(b"".join(("\r\n".join(lines).encode("latin-1"), b"\r\n\r\n", body)))

    def read_response(self, timeout_s: float) -> tuple[int, dict[str, str], bytes]:
        """The whole response: status, headers (lower-case names), body. Raises ConnectionDropped when the
        server closed the connection without answering, TimeoutError when a read waits ``timeout_s``."""
        response = _Response()
        self._feed_until(response, timeout_s, lambda: response.done)
        self.keep_alive = response.keep_alive
        body = response.body[0] if len(response.body) == 1 else b"".join(response.body)
        return response.parser.get_status_code(), response.headers, body

    def read_stream(self, timeout_s: float) -> tuple[int, dict[str, str], Iterator[bytes]]:
        """The response's status and headers, then its body as it comes (chunks de-chunked), each read waiting at
        most ``timeout_s``."""
        response = _Response()
        self._feed_until(response, timeout_s, lambda: response.headers_done)

        def body() -> Iterator[bytes]:
            while True:
                chunks, response.body = response.body, []
                yield from chunks
                if response.done:
                    self.keep_alive = response.keep_alive
                    return
                self._feed_until(response, timeout_s, lambda: bool(response.body) or response.done)

        return response.parser.get_status_code(), response.headers, body()

    def _feed_until(self, response: _Response, timeout_s: float, ready: Callable[[], bool]) -> None:
        self.sock.settimeout(timeout_s)
        view = memoryview(self._buffer)
        received = 0
        while not ready():
            count = self.sock.recv_into(self._buffer)
            if not count:
                self.keep_alive = False
                if not received and not response.headers:
                    raise ConnectionDropped("the server closed the connection without answering")
                raise ConnectionResetError("the server closed the connection in the middle of a response")
            received += count
            try:
                response.parser.feed_data(view[:count])
            except httptools.HttpParserError as exc:
                self.keep_alive = False
                raise ConnectionResetError(f"the server sent a malformed response: {exc}") from None
