"""A request with a big body sent to a real server, and the server process's memory (a module, like
trickling_server.py): what a caller without the API key costs a grpo server (issue 31, item 4)."""

from __future__ import annotations

import contextlib
import json
import socket
from urllib.parse import urlsplit

CHUNK = b"[" + b"1," * (2**19 - 1)  # 1 MiB of a JSON array that never ends


def memory_mb(pid: int) -> dict[str, float]:
    """The process's resident memory now (``rss``) and its peak so far (``hwm``), in MiB (/proc/PID/status)."""
    out = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                out[key[2:].lower()] = int(value.split()[0]) / 1024
    return out


def send(url: str, path: str, size: int, *, headers: dict[str, str] | None = None, chunked: bool = False,
         timeout: float = 60.0) -> tuple[int, dict, int]:
    """POST ``size`` bytes to ``url + path`` over a raw socket (Content-Length, or chunked), sending
    until done or the server stops taking them; (status, the JSON answer, bytes the server took)."""
    parts = urlsplit(url)
    head = [f"POST {path} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json",
            "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}",
            *(f"{k}: {v}" for k, v in (headers or {}).items())]
    sent = 0
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        with contextlib.suppress(OSError):  # the server answered and closed: the rest is not sent
            while sent < size:
                piece = CHUNK[: size - sent]
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                sent += len(piece)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer and _complete(answer):
                    break
    head_text, _, body = answer.partition(b"\r\n\r\n")
    status = int(head_text.split(b" ", 2)[1]) if head_text else 0
    return status, json.loads(body or b"null"), sent


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False
