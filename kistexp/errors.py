"""Error types. Every error a user can cause is a KistexpError with a one-line message;
the CLI prints it and exits non-zero, never with a traceback."""


class KistexpError(Exception):
    """Base class: the message is one line naming the file, key or URL and the problem."""

    exit_code = 1


class PlanError(KistexpError):
    """An experiment plan cannot be loaded (syntax, schema, types).

    ``file``, ``line`` and ``key`` locate the problem where known, so the linter can
    report it as a finding.
    """

    def __init__(self, message: str, *, file: str = "", line: int | None = None, key: str = "",
                 problem: str = "") -> None:
        # a plan's own strings (parameter names, values) may hold escaped control characters:
        # shown escaped, so the error stays one line
        message, problem = _one_line(message), _one_line(problem)
        super().__init__(message)
        self.file, self.line, self.key, self.problem = file, line, key, problem or message


_CONTROL = {c: f"\\x{c:02x}" for c in range(32) if c != 9} | {10: "\\n", 13: "\\r", 127: "\\x7f"}


def _one_line(text: str) -> str:
    return text.translate(_CONTROL)


class DocumentError(KistexpError):
    """A directory document (vote, consensus, certificate) is malformed or fails verification."""


class DirectoryError(KistexpError):
    """A directory server could not be reached or answered badly."""


class SimConfigError(KistexpError):
    """Invalid simulator configuration, detected before anything runs."""


class LocalNetError(KistexpError):
    """The local tor network could not be started, queried or stopped."""


class PopulationError(KistexpError):
    """A consensus, GeoIP file, sampling request or relay-class TOML cannot be used for a population."""


class SweepError(KistexpError):
    """A sweep file cannot be used, or its cells cannot be run or stored (cache, Dask scheduler)."""


class DispatchError(KistexpError):
    """Cells cannot be run: ``--workers`` out of bounds, a Dask scheduler that does not answer or whose
    workers cannot run kistexp, or a cell that failed (``kistexp.population.dispatch``)."""


class FidelityHistoryError(KistexpError):
    """A fidelity history CSV cannot be read, recorded to or plotted."""


class AnonymityError(KistexpError):
    """An attack measure cannot be computed from the traces given (``kistexp.anonymity``): too few
    flows for the false-positive rate asked, traces of different networks paired, no samples."""
