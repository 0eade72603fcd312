"""Processes of a local network: only the tors we started, identified by pid AND command
line (the torrc path), are ever signalled; every wait is bounded."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from kistexp.errors import LocalNetError

POLL_S = 0.1


#: the kernel's PF_EXITING task flag (include/linux/sched.h), in /proc/PID/stat's ninth field
PF_EXITING = 0x4


def cmdline(pid: int) -> list[str] | None:
    """The argv of a live, non-zombie process, or None when there is no such process.

    An empty command line means one of two things.  A process that is exiting (after a SIGKILL,
    say) has released its memory before it turns zombie: it is gone, so None.  A live one without
    it is a kernel thread or a process in the middle of ``execve`` (the kernel closes its
    close-on-exec pipes, which wakes a ``subprocess.Popen`` caller, before it has set up the new
    argv): that is ``[]``, alive and nobody's tor."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # state and flags are the first and seventh fields after the parenthesised command name
    fields = stat.rsplit(")", 1)[-1].split() if ")" in stat else []
    state = fields[0] if fields else "?"
    if state in ("Z", "X"):
        return None
    if not raw:
        exiting = len(fields) > 6 and fields[6].isdecimal() and int(fields[6]) & PF_EXITING
        return None if exiting else []
    return raw.rstrip(b"\0").decode(errors="replace").split("\0")


def is_our_tor(pid: int | None, torrc: Path) -> bool:
    """True if ``pid`` is alive and is a tor started with ``-f torrc``."""
    if not pid or pid <= 1:
        return False
    return _is_tor_with(cmdline(pid), torrc)


def _is_tor_with(argv: list[str] | None, torrc: Path) -> bool:
    return bool(argv) and Path(argv[0]).name == "tor" and str(torrc) in argv


def signal_ours(pid: int | None, torrc: Path, sig: int) -> bool:
    """Send ``sig`` to ``pid`` only if it is our tor; returns whether it was sent."""
    return is_our_tor(pid, torrc) and _kill(pid, sig)  # type: ignore[arg-type]


def _kill(pid: int, sig: int) -> bool:
    """Send ``sig``; False when the process has gone meanwhile."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def terminate(procs: Iterable[tuple[int | None, Path]], timeout_s: float = 10.0) -> dict[int, str]:
    """SIGTERM each of our tors, then SIGKILL those still alive after ``timeout_s``.

    Returns {pid: "terminated" | "killed" | "not running" | "not ours"}. With
    ShutdownWaitLength 0 tor exits at once on SIGTERM.
    """
    result: dict[int, str] = {}
    waiting: list[tuple[int, Path]] = []
    signalled: list[int] = []
    for pid, torrc in procs:
        if not pid:
            continue
        if pid <= 1:
            result[pid] = "not ours"
            continue
        # one reading of the command line decides: a tor exiting between two readings would be
        # reported as a stranger
        argv = cmdline(pid)
        if argv is None:
            result[pid] = "not running"
        elif not _is_tor_with(argv, torrc):
            result[pid] = "not ours"
        elif not _kill(pid, signal.SIGTERM):
            result[pid] = "not running"
        else:
            waiting.append((pid, torrc))
            signalled.append(pid)
    deadline = time.monotonic() + timeout_s
    while waiting and time.monotonic() < deadline:
        waiting = [(p, t) for p, t in waiting if is_our_tor(p, t)]
        if waiting:
            time.sleep(POLL_S)
    for pid, torrc in waiting:
        if signal_ours(pid, torrc, signal.SIGKILL):
            result[pid] = "killed"
    for pid in signalled:
        result.setdefault(pid, "terminated")
    return result


def poll(what: str, check: Callable[[], object], timeout_s: float, interval_s: float = 0.25) -> object:
    """Call ``check`` until it returns a truthy value; LocalNetError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise LocalNetError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


def port_in_use(address: str, port: int) -> bool:
    """True if something listens on address:port (a bind with SO_REUSEADDR fails)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
    except OSError:
        return True
    finally:
        sock.close()
    return False


def last_log_line(path: Path, containing: str = "", tail_bytes: int = 8192) -> str:
    """The last non-empty line (holding ``containing``) of a log file's last ``tail_bytes``, for error messages."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - tail_bytes))
            lines = [ln for ln in fh.read(tail_bytes).decode(errors="replace").splitlines()
                     if ln.strip() and containing in ln]
    except OSError:
        return "(no log)"
    return lines[-1].strip() if lines else "(empty log)"


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a process so far (from /proc/PID/stat), or None."""
    if not pid:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    # after the command name: state is field 3, utime 14 and stime 15 (1-based)
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def core_wait_seconds(pid: int | None) -> float | None:
    """Time all of a process's threads have spent runnable but not running so far: waiting for a
    core (the second field of Linux's /proc/PID/task/TID/schedstat, in ns), or None where the
    process is gone or the kernel keeps no such account (``CONFIG_SCHED_INFO``).  A thread that
    exited takes its share with it; a tor's main thread, which runs its event loop, lives as long
    as the tor."""
    if not pid:
        return None
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None
    total = 0
    seen = False
    for tid in tids:
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if len(fields) >= 2:
            total += int(fields[1])
            seen = True
    return total / 1e9 if seen else None
