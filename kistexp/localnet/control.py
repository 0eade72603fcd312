"""A minimal tor control-port client (control-spec: AUTHENTICATE with the cookie, SETCONF,
GETINFO) for the local network's own tors; every call is bounded by a socket timeout."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from kistexp.errors import LocalNetError

TIMEOUT_S = 10.0


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class ControlPort:
    """One authenticated control connection to a tor on 127.0.0.1."""

    def __init__(self, port: int, cookie_file: Path, where: str) -> None:
        self.where = f"{where} ControlPort {port}"
        try:
            cookie = Path(cookie_file).read_bytes()
        except OSError as exc:
            raise LocalNetError(f"{self.where}: cannot read {cookie_file}: {exc.strerror}") from None
        try:
            self._sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        except OSError as exc:
            raise LocalNetError(f"{self.where}: cannot connect: {exc.strerror or exc}") from None
        self._buf = b""
        self.command(f"AUTHENTICATE {cookie.hex()}")

    def close(self) -> None:
        try:
            self._sock.sendall(b"QUIT\r\n")
        except OSError:
            pass
        self._sock.close()

    def __enter__(self) -> ControlPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _line(self) -> str:
        while b"\r\n" not in self._buf:
            try:
                chunk = self._sock.recv(65536)
            except OSError as exc:
                raise LocalNetError(f"{self.where}: {exc.strerror or exc}") from None
            if not chunk:
                raise LocalNetError(f"{self.where}: connection closed")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\r\n", 1)
        return line.decode(errors="replace")

    def command(self, text: str) -> list[str]:
        """Send one command; return the reply lines (without status codes) or raise on non-250."""
        try:
            self._sock.sendall(text.encode() + b"\r\n")
        except OSError as exc:
            raise LocalNetError(f"{self.where}: {exc.strerror or exc}") from None
        lines: list[str] = []
        while True:
            line = self._line()
            code, sep, rest = line[:3], line[3:4], line[4:]
            if code != "250":
                verb = text.split(" ", 1)[0]
                raise LocalNetError(f"{self.where}: {verb} failed: {line}")
            if sep == "+":  # data block until a lone "."
                lines.append(rest)
                while (data := self._line()) != ".":
                    lines.append(data)
                continue
            lines.append(rest)
            if sep == " ":
                return lines

    def set_conf(self, options: Mapping[str, str | Sequence[str] | None]) -> None:
        parts = []
        for key, value in options.items():
            if value is None:
                parts.append(key)
            elif isinstance(value, str):
                parts.append(f"{key}={_quote(value)}")
            else:
                parts.extend(f"{key}={_quote(v)}" for v in value)
        self.command("SETCONF " + " ".join(parts))

    def get_info(self, key: str) -> str:
        lines = self.command(f"GETINFO {key}")
        first = lines[0].partition("=")[2] if lines else ""
        body = [first, *lines[1:-1]] if len(lines) > 1 else [first]
        return "\n".join(x for x in body if x)
