"""The counting reverse proxy: measures bytes on the wire independently of the
server. One runs in front of every target (asyncio, in a background thread,
on 127.0.0.1); each client connection gets its own upstream connection and
bytes are forwarded unchanged as they arrive, never buffered whole.

It parses just enough HTTP/1.1 to cut a keep-alive connection into requests:
request head and body (Content-Length or chunked), interim 1xx responses,
response head and body (Content-Length, chunked, or until close). Every byte
read from the client is counted to the request it belongs to, every byte read
from the server to its response. For `POST .../git-upload-pack` responses the
de-chunked body is also walked as pkt-lines to count the pack data alone
(`PackCounter`).

A RequestRecord is appended when its request head arrives (so `.mark()` /
`.since()` select by start) and is updated in place as bytes flow; its
counts are final once its response is complete (`status` is 0 until the
response head arrives). Counts are updated before the bytes are passed on,
so once a client has read its last byte the record already holds it.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections import deque
from typing import Callable, Optional

from .model import RequestRecord

_CHUNK = 65536
_HEAD_LIMIT = 1 << 20


class PackCounter:
    """Counts the pack data bytes in a (de-chunked) upload-pack response body.

    Pkt-lines whose payload starts with band byte 1 carry pack data (side-band
    and side-band-64k in v0/v1, the `packfile` section in v2); flush, delim and
    response-end packets carry none. Without side-band the pack follows the
    ACK/NAK lines raw, starting with `PACK`: from there every byte counts."""

    def __init__(self) -> None:
        self.pack_bytes = 0
        self._hdr = bytearray()
        self._remaining = 0          # payload bytes left in the current pkt-line
        self._band: Optional[int] = None
        self._raw = False
        self._broken = False

    def feed(self, data: bytes) -> None:
        if self._raw:
            self.pack_bytes += len(data)
            return
        if self._broken:
            return
        i, n = 0, len(data)
        while i < n:
            if self._remaining == 0:
                take = data[i:i + 4 - len(self._hdr)]
                self._hdr += take
                i += len(take)
                if len(self._hdr) < 4:
                    return
                hdr = bytes(self._hdr)
                self._hdr.clear()
                if hdr == b"PACK":
                    self._raw = True
                    self.pack_bytes += 4 + (n - i)
                    return
                try:
                    length = int(hdr, 16)
                except ValueError:
                    self._broken = True
                    return
                if length >= 4:
                    self._remaining = length - 4
                    self._band = None
                continue
            take = min(self._remaining, n - i)
            if self._band is None and take:
                self._band = data[i]
                if self._band == 1:
                    self.pack_bytes -= 1   # the band byte itself is not pack data
            if self._band == 1:
                self.pack_bytes += take
            self._remaining -= take
            i += take


def _parse_head(head: bytes) -> tuple[list[str], dict[str, str]]:
    """The start line's words and the headers (lower-case names; repeated values joined by ',')."""
    lines = head.decode("latin-1").split("\r\n")
    start = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(":")
        name = name.strip().lower()
        value = value.strip()
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    return start, headers


def _is_chunked(headers: dict[str, str]) -> bool:
    return "chunked" in headers.get("transfer-encoding", "").lower()


async def _read_head(reader: asyncio.StreamReader) -> Optional[bytes]:
    """The next message head (through the blank line), or None at a clean EOF."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if e.partial.strip():
            raise ConnectionError("connection closed inside a message head") from None
        return None


async def _forward_exactly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, size: int,
                           count: Callable[[int], None], on_data: Optional[Callable[[bytes], None]],
                           on_last: Optional[Callable[[], None]], where: str) -> None:
    """Forward exactly SIZE bytes; ON_LAST is called before the last write."""
    remaining = size
    while remaining:
        data = await reader.read(min(remaining, _CHUNK))
        if not data:
            raise ConnectionError(f"connection closed {where}")
        remaining -= len(data)
        count(len(data))
        if on_data:
            on_data(data)
        if not remaining and on_last:
            on_last()
        writer.write(data)
        await writer.drain()


async def _pipe_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, headers: dict[str, str],
                     count: Callable[[int], None], on_data: Optional[Callable[[bytes], None]],
                     on_end: Callable[[], None], until_close: bool) -> None:
    """Forward one message body. COUNT gets each raw byte count before it is
    written, ON_DATA the de-chunked payload, ON_END is called before the last
    write. UNTIL_CLOSE: no length given, the body ends with the connection."""
    if _is_chunked(headers):
        while True:
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                tail = bytearray(line)
                while True:
                    trailer = await reader.readuntil(b"\r\n")
                    tail += trailer
                    if trailer == b"\r\n":
                        break
                count(len(tail))
                on_end()
                writer.write(tail)
                await writer.drain()
                return
            count(len(line))
            writer.write(line)
            await _forward_exactly(reader, writer, size, count, on_data, None, "inside a chunk")
            crlf = await reader.readexactly(2)
            count(2)
            writer.write(crlf)
    elif "content-length" in headers:
        size = int(headers["content-length"].split(",")[0])
        if size == 0:
            on_end()
        await _forward_exactly(reader, writer, size, count, on_data, on_end, "inside a body")
    elif until_close:
        while True:
            data = await reader.read(_CHUNK)
            if not data:
                on_end()
                return
            count(len(data))
            if on_data:
                on_data(data)
            writer.write(data)
            await writer.drain()
    else:
        on_end()


class _Exchange:
    """A request in flight on one connection, and its record."""

    def __init__(self, record: RequestRecord, t0: float):
        self.record = record
        self.t0 = t0
        self.method = record.method
        self.pack: Optional[PackCounter] = None
        self.finished = False

    def add_request(self, n: int) -> None:
        self.record.request_bytes += n

    def add_response(self, n: int) -> None:
        self.record.response_bytes += n

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        if self.pack is not None:
            self.record.pack_bytes = self.pack.pack_bytes
        self.record.ms = (time.monotonic() - self.t0) * 1000.0


class CountingProxy:
    """A counting HTTP/1.1 reverse proxy from 127.0.0.1:PORT to UPSTREAM.

    `tls=True` speaks TLS to the upstream (for an https URL target);
    `host_header` replaces the Host header sent upstream (counts stay those of
    the bytes the client sent)."""

    def __init__(self, upstream_host: str, upstream_port: int, target_name: str, *, port: int = 0,
                 tls: bool = False, host_header: Optional[str] = None):
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.target_name = target_name
        self.port = port
        self.tls = tls
        self.host_header = host_header
        self._records: list[RequestRecord] = []
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._server: Optional[asyncio.AbstractServer] = None
        self._tasks: set[asyncio.Task] = set()

    # -- public API -------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def records(self) -> list[RequestRecord]:
        """A snapshot of every record so far, in order of request start."""
        with self._lock:
            return list(self._records)

    def mark(self) -> int:
        with self._lock:
            return len(self._records)

    def since(self, mark: int) -> list[RequestRecord]:
        """The records of requests started after `mark()` returned MARK."""
        with self._lock:
            return self._records[mark:]

    def start(self) -> "CountingProxy":
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                self._server = loop.run_until_complete(asyncio.start_server(
                    self._handle, "127.0.0.1", self.port, limit=_HEAD_LIMIT, backlog=4096))
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as e:  # noqa: BLE001 - reported to start()
                failure.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name=f"proxy-{self.target_name}", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=10)
        except Exception:  # noqa: BLE001 - stopping regardless
            pass
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=10)
        self._thread = None
        self._loop = None

    def __enter__(self) -> "CountingProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- connections --------------------------------------------------------

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        uwriter = None
        try:
            try:
                ureader, uwriter = await asyncio.open_connection(
                    self.upstream_host, self.upstream_port, limit=_HEAD_LIMIT,
                    ssl=ssl.create_default_context() if self.tls else None,
                    server_hostname=self.upstream_host if self.tls else None)
            except OSError:
                cwriter.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await cwriter.drain()
                return
            pending: deque[_Exchange] = deque()
            up = asyncio.ensure_future(self._requests(creader, uwriter, pending))
            down = asyncio.ensure_future(self._responses(ureader, cwriter, pending))
            try:
                done, _ = await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
                if up in done and not down.done() and pending:
                    # The client finished sending; let the server answer what it asked.
                    await asyncio.wait([down])
            finally:
                for t in (up, down):
                    t.cancel()
                await asyncio.gather(up, down, return_exceptions=True)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError, ValueError):
            pass
        finally:
            for w in (cwriter, uwriter):
                if w is not None:
                    w.close()
            self._tasks.discard(task)

    async def _requests(self, creader: asyncio.StreamReader, uwriter: asyncio.StreamWriter,
                        pending: deque) -> None:
        try:
            while True:
                head = await _read_head(creader)
                if head is None:
                    break
                start, headers = _parse_head(head)
                method, target = start[0], start[1] if len(start) > 1 else ""
                record = RequestRecord(target=self.target_name, method=method, path=target, status=0,
                                       request_bytes=len(head), response_bytes=0, pack_bytes=0,
                                       started=time.time(), ms=0.0,
                                       forwarded=headers.get("x-forwarded-for", ""))
                ex = _Exchange(record, time.monotonic())
                if method == "POST" and target.split("?", 1)[0].endswith("/git-upload-pack"):
                    ex.pack = PackCounter()
                with self._lock:
                    self._records.append(record)
                pending.append(ex)
                if self.host_header is not None:
                    head = _replace_host(head, self.host_header)
                uwriter.write(head)
                await uwriter.drain()
                await _pipe_body(creader, uwriter, headers, ex.add_request, None, lambda: None, False)
        finally:
            if uwriter.can_write_eof():
                try:
                    uwriter.write_eof()
                except OSError:
                    pass

    async def _responses(self, ureader: asyncio.StreamReader, cwriter: asyncio.StreamWriter,
                         pending: deque) -> None:
        while True:
            head = await _read_head(ureader)
            if head is None:
                return
            start, headers = _parse_head(head)
            status = int(start[1]) if len(start) > 1 and start[1].isdigit() else 0
            ex = pending[0] if pending else _Exchange(
                RequestRecord(self.target_name, "?", "?", 0, 0, 0, 0, time.time(), 0.0), time.monotonic())
            ex.add_response(len(head))
            if 100 <= status < 200 and status != 101:
                cwriter.write(head)      # interim (100 Continue): the final response follows
                await cwriter.drain()
                continue
            ex.record.status = status
            if pending:
                pending.popleft()
            no_body = ex.method == "HEAD" or status in (204, 304) or status == 101
            if no_body or (not _is_chunked(headers) and headers.get("content-length", "").strip() == "0"):
                ex.finish()
                cwriter.write(head)
                await cwriter.drain()
            else:
                cwriter.write(head)
                on_data = ex.pack.feed if (ex.pack is not None and status == 200) else None
                if on_data is None:
                    ex.pack = None
                await _pipe_body(ureader, cwriter, headers, ex.add_response, on_data, ex.finish, True)
            version = start[0].upper()
            conn = headers.get("connection", "").lower()
            if "close" in conn or (version == "HTTP/1.0" and "keep-alive" not in conn) or status == 101 or (
                    not no_body and not _is_chunked(headers) and "content-length" not in headers):
                return


def _replace_host(head: bytes, host: str) -> bytes:
    lines = head.split(b"\r\n")
    for i, line in enumerate(lines):
        if line[:5].lower() == b"host:":
            lines[i] = b"Host: " + host.encode("latin-1")
    return b"\r\n".join(lines)
