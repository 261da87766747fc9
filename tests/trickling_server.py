"""A real server on 127.0.0.1 that answers every request one byte at a time, never finishing (a module,
like recording_proxy.py): what a client's per-read timeout alone would wait on forever."""

from __future__ import annotations

import contextlib
import socket
import threading

#: Trickled from the status line on (``headers``), or after whole headers that promise a long body (``body``).
ANSWERS = {
    "headers": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"X-Pad: " + b"x" * 10**6,
    "body": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
            + b'{"scores": [' + b" " * 10**6,
}


class TricklingServer:
    """Accepts connections, reads each request, then sends its answer one byte every ``every`` s."""

    def __init__(self, part: str = "body", every: float = 0.1) -> None:
        self.answer, self.every = ANSWERS[part], every
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stopped = threading.Event()
        self.requests = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.requests += 1
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the client hung up
            conn.recv(65536)
            for i in range(len(self.answer)):
                if self.stopped.wait(self.every):
                    return
                conn.sendall(self.answer[i : i + 1])

    def close(self) -> None:
        self.stopped.set()
        self.sock.close()
