"""Reading and writing a file named by a user without trusting what the name points at.

Plans, votes, consensuses, key certificates and state files are read through ``read_bounded``: only a
regular file is read, in chunks, and never more than a size cap. What the name may point at instead,
and what happened before this rule:

* ``/dev/zero`` or ``/dev/urandom`` (an endless character device): a plain ``read_bytes()`` ran until
  MemoryError at 2.1 GB;
* a FIFO: opening it blocks until a writer appears, for ever;
* a directory, a socket, a block device;
* a ``/proc`` or ``/sys`` file: a regular file whose size says 0 (or 4096) and whose content is whatever the
  kernel makes up at read time, possibly unbounded.

Each gets one line naming the file and what it is instead. A file that grows past its ``stat`` size while it
is read (a log still being written, a kernel file) is refused too: what was checked is what is read.

Reports, announcements, plots, state and sweep files are written through ``write_atomic`` (or, for a file
that grows as it is written, ``open_output``): only to a new name or a regular file, never through a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from kistexp.errors import KistexpError

CHUNK_BYTES = 64 * 1024
# Kernel-made files: regular by stat(), but their size is not their content.
_VIRTUAL_ROOTS = ("/proc", "/sys")


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words ("a FIFO (named pipe)", "a character device", ...)."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _is_virtual(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root + "/") for root in _VIRTUAL_ROOTS)


def open_regular_fd(path: str | os.PathLike[str], what: str,
                    error: type[KistexpError] = KistexpError) -> tuple[int, os.stat_result]:
    """A read-only descriptor of ``path`` and its stat, if it is a regular file; anything else (a FIFO, a
    device, a directory, a kernel file under /proc or /sys) raises ``error`` naming what it is."""
    name = os.fsdecode(path)
    if _is_virtual(name):
        raise error(f"{name}: not a regular file ({what} cannot be read from a kernel file under /proc or /sys)")
    try:
        # O_NONBLOCK: opening a FIFO without a writer returns at once instead of blocking; the type check
        # below then refuses it. It does not change how a regular file is read.
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{name}: cannot read {what}: no such file") from None
    except IsADirectoryError:
        raise error(f"{name}: not a regular file ({what} expected, found a directory)") from None
    except OSError as exc:
        raise error(f"{name}: cannot read {what}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{name}: not a regular file ({what} expected, found {kind_of(info.st_mode)})")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def read_bounded(path: str | os.PathLike[str], limit: int, what: str,
                 error: type[KistexpError] = KistexpError) -> bytes:
    """The bytes of regular file ``path``, at most ``limit`` of them; anything else raises ``error``.

    ``what`` names the content in messages ("plan", "key certificates"); every message starts with the path.
    """
    name = os.fsdecode(path)
    fd, info = open_regular_fd(path, what, error)
    try:
        if info.st_size > limit:
            raise error(f"{name}: {what} file is {info.st_size} bytes, larger than the {limit}-byte limit")
        chunks: list[bytes] = []
        total = 0
        want = info.st_size + 1  # one byte more than stat promised: proof the file is still growing
        while total < want:
            try:
                chunk = os.read(fd, min(CHUNK_BYTES, want - total))
            except BlockingIOError:
                raise error(f"{name}: cannot read {what}: the file would block") from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > info.st_size:
            raise error(f"{name}: {what} file grew while it was read (past its {info.st_size} bytes); "
                        "read a finished copy")
        return b"".join(chunks)
    except OSError as exc:
        if exc.errno == errno.EISDIR:
            raise error(f"{name}: not a regular file ({what} expected, found a directory)") from None
        raise error(f"{name}: cannot read {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_bounded_text(path: str | os.PathLike[str], limit: int, what: str,
                      error: type[KistexpError] = KistexpError) -> str:
    """``read_bounded`` decoded as UTF-8; bad bytes are a one-line error naming the first one."""
    raw = read_bounded(path, limit, what, error)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{os.fsdecode(path)}: {what} is not UTF-8 text (byte {exc.start})") from None


# --- writing a file named by a user --------------------------------------------------------------
#
# A destination is written only if it does not exist yet or is a regular file. The temporary file
# is renamed over the name, which replaces whatever directory entry is there: run as root,
# ``kistexp report EXP -o /dev/null`` once replaced the machine's /dev/null with a regular file. A
# FIFO, a device, a socket or a directory is refused in one line, before anything is created.
#
# A symbolic link is refused too, whatever it points at. Following it would let a link planted in a
# shared directory (/tmp) steer the write into any file the user may write; renaming over it would
# silently turn the user's link into a plain file. The user names the target itself instead.


class OutputPathError(KistexpError):
    """An output path that names something other than a regular file or a new file."""


def check_output_path(path: str | os.PathLike[str], what: str,
                      error: type[KistexpError] = OutputPathError) -> None:
    """Refuse ``path`` as a destination unless it is absent or a regular file (not a symlink)."""
    name = os.fsdecode(path)
    shown = _shown(name)
    if "\0" in name:
        raise error(f"{shown}: cannot write {what}: the name holds a NUL byte")
    try:
        info = os.lstat(name)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise error(f"{shown}: cannot write {what}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(info.st_mode):
        try:
            target = f" (to {_shown(os.readlink(name))})"
        except OSError:
            target = ""
        raise error(f"{shown}: cannot write {what}: it is a symbolic link{target}; name the file itself")
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{shown}: cannot write {what}: it is {kind_of(info.st_mode)}, not a regular file")


def _shown(name: str) -> str:
    # a name with a line break or an escape sequence is quoted, so the error stays one line
    return name if name.isprintable() else repr(name)


def write_atomic(path: str | os.PathLike[str], data: bytes, what: str,
                 error: type[KistexpError] = KistexpError) -> None:
    """Write ``data`` to ``path`` whole or not at all: a temporary file in the same directory,
    flushed, then renamed over ``path``. A reader never sees half a file and a failure (no such
    directory, no permission, disk full, a directory in the way) leaves nothing behind. Only a new
    name or a regular file is written (``check_output_path``)."""
    import tempfile

    name = os.fsdecode(path)
    check_output_path(name, what, error)
    folder = os.path.dirname(os.path.abspath(name))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(name)}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise error(f"{name}: cannot write {what}: {exc.strerror or exc}") from None
    try:
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o644)
            # checked again just before the rename: what was refused a moment ago is still refused
            check_output_path(name, what, error)
            os.replace(tmp, name)
        except OSError as exc:
            raise error(f"{name}: cannot write {what}: {exc.strerror or exc}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def open_output(path: str | os.PathLike[str], what: str, error: type[KistexpError] = OutputPathError,
                **text: str):
    """``path`` opened for writing as text (``open``'s ``encoding``/``newline`` in ``text``), for a
    file written as it grows (a sweep's partial.csv): refused like ``write_atomic``'s destinations.
    O_NOFOLLOW and O_NONBLOCK make a link or a FIFO put there after the check fail at once instead of
    being followed or blocking; the opened file is checked again by ``fstat``."""
    name = os.fsdecode(path)
    check_output_path(name, what, error)
    flags = (os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NOCTTY", 0)
             | getattr(os, "O_CLOEXEC", 0))
    try:
        fd = os.open(name, flags, 0o644)
    except OSError as exc:  # ELOOP: a link put there after the check; ENXIO: a FIFO with no reader
        raise error(f"{_shown(name)}: cannot write {what}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{_shown(name)}: cannot write {what}: it is {kind_of(info.st_mode)}, not a regular file")
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)  # truncated only once it is known to be a regular file
    except OSError as exc:
        os.close(fd)
        raise error(f"{_shown(name)}: cannot write {what}: {exc.strerror or exc}") from None
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "w", **text)
