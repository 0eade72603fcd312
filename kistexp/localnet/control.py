"""Control-port connections to the local network's own tors, through stem's ``Controller``
(control-spec §3: AUTHENTICATE with the cookie, SETCONF, GETCONF, GETINFO, SIGNAL RELOAD,
CLOSECIRCUIT).

One connection per use, opened and closed by the caller (``with net.control(name) as ctl``):
stem runs a reader thread per connection, and a connection left open while its tor is stopped
ends in stem's SocketClosed. Authentication is the cookie file of the node's own DataDirectory,
read from the path kistexp wrote into its torrc, not the path tor advertises. stem's cache of
GETCONF answers is off: a RELOAD changes the configuration behind stem's back, and the answer
must be tor's, not stem's memory of it. Every stem error becomes one LocalNetError line.

stem logs "Error while receiving a control message (SocketClosed): empty socket content" at INFO
each time a connection is closed (its reader thread sees the EOF it caused): expected, not a fault;
a test that fails for another reason shows these lines in its captured log.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from kistexp.errors import LocalNetError
from kistexp.localnet.spec import LOOPBACK


class ControlPort:
    """One authenticated stem ``Controller`` on a tor at 127.0.0.1 (a context manager)."""

    def __init__(self, port: int, cookie_file: Path, where: str) -> None:
        import stem
        import stem.connection
        import stem.control

        self.where = f"{where} ControlPort {port}"
        if not Path(cookie_file).is_file():
            raise LocalNetError(f"{self.where}: cannot read {cookie_file}: no such file")
        with warnings.catch_warnings():
            # stem 1.8 starts its reader threads with Thread.setDaemon, deprecated since Python 3.10
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                self.controller = stem.control.Controller.from_port(address=LOOPBACK, port=port)
            except stem.SocketError as exc:
                raise LocalNetError(f"{self.where}: cannot connect: {exc}") from None
            try:
                stem.connection.authenticate_cookie(self.controller, str(cookie_file))
                self.controller.set_caching(False)
            except (stem.connection.AuthenticationFailure, stem.ControllerError, stem.SocketError) as exc:
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
        """SETCONF: all or nothing; a None value resets the option to its default."""
        values = {k: (v if v is None or isinstance(v, str) else list(v)) for k, v in options.items()}
        with self._errors("SETCONF"):
            self.controller.set_options(values)

    def get_conf(self, key: str) -> list[str]:
        """GETCONF: every value of the option as tor is configured now (empty when unset)."""
        with self._errors("GETCONF"):
            return [v for v in self.controller.get_conf(key, multiple=True) if v]

    def get_info(self, key: str) -> str:
        with self._errors("GETINFO"):
            return self.controller.get_info(key)

    def reload(self) -> None:
        """SIGNAL RELOAD, the control port's SIGHUP: tor re-reads its torrc and %includes."""
        import stem

        with self._errors("SIGNAL RELOAD"):
            self.controller.signal(stem.Signal.RELOAD)

    def circuit_ids(self) -> set[str]:
        """The ids of the circuits tor has open or is building (GETINFO circuit-status)."""
        with self._errors("GETINFO circuit-status"):
            return {c.id for c in self.controller.get_circuits()}

    def close_circuits(self) -> None:
        """CLOSECIRCUIT every circuit, clean preemptive ones included. A circuit that closes by
        itself meanwhile is not an error."""
        import stem

        for cid in self.circuit_ids():
            with self._errors(f"CLOSECIRCUIT {cid}"):
                try:
                    self.controller.close_circuit(cid)
                except stem.InvalidArguments:
                    pass  # "Unknown circuit": it closed on its own
