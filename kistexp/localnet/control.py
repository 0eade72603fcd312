"""Control-port connections to the local network's own tors, through stem's ``Controller``
(control-spec: PROTOCOLINFO, AUTHENTICATE with the cookie, SETCONF, GETINFO, SIGNAL). Each
connection is bounded by stem's socket timeouts; stem's errors become one-line LocalNetErrors."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from kistexp.errors import LocalNetError
from kistexp.localnet.spec import LOOPBACK


class ControlPort:
    """One authenticated stem ``Controller`` on a tor at 127.0.0.1 (use as a context manager)."""

    def __init__(self, port: int, where: str) -> None:
        import stem
        import stem.connection
        import stem.control

        self.where = f"{where} ControlPort {port}"
        try:
            self.controller = stem.control.Controller.from_port(address=LOOPBACK, port=port)
        except stem.SocketError as exc:
            raise LocalNetError(f"{self.where}: cannot connect: {exc}") from None
        try:
            # the cookie's path comes from PROTOCOLINFO: the node's own DataDirectory
            self.controller.authenticate()
        except (stem.connection.AuthenticationFailure, stem.ControllerError) as exc:
            self.controller.close()
            raise LocalNetError(f"{self.where}: cannot authenticate: {exc}") from None

    def close(self) -> None:
        self.controller.close()

    def __enter__(self) -> ControlPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        import stem

        try:
            yield
        except (stem.ControllerError, stem.SocketError) as exc:
            raise LocalNetError(f"{self.where}: {what} failed: {exc}") from None

    def set_conf(self, options: Mapping[str, str | Sequence[str] | None]) -> None:
        """SETCONF: tor applies the options all or nothing; a None value resets one to its default."""
        with self._errors("SETCONF"):
            self.controller.set_options({k: (list(v) if v is not None and not isinstance(v, str) else v)
                                         for k, v in options.items()})

    def get_conf(self, key: str) -> list[str]:
        with self._errors("GETCONF"):
            return list(self.controller.get_conf(key, multiple=True))

    def get_info(self, key: str) -> str:
        with self._errors("GETINFO"):
            return self.controller.get_info(key)

    def reload(self) -> None:
        """SIGNAL RELOAD, the control-port SIGHUP: tor re-reads its torrc and %includes."""
        import stem

        with self._errors("SIGNAL RELOAD"):
            self.controller.signal(stem.Signal.RELOAD)
