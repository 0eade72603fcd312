"""Render a report in headless Chromium: a screenshot and the page's console messages, or the DOM.

Used by the report's browser test and by bench/report_screenshot.py (the screenshot in
docs/reports.md). Chromium runs with a throw-away profile, no network (every host name fails to
resolve and the proxy is a closed port), and a time bound; console messages are read from its
log on stderr, where Chromium writes each one as ``INFO:CONSOLE(line)] "message", source: URL``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import attrs

from kistexp.errors import KistexpError

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
_CONSOLE = re.compile(r":INFO:CONSOLE[^\]]*\]\s*(.*)")


class BrowserError(KistexpError):
    """Chromium is missing or did not render the page."""


@attrs.frozen
class Rendered:
    screenshot: Path
    console: tuple[str, ...]  # every console message the page logged (errors, CSP refusals, ...)
    log: str


def find_chromium() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def render(html: Path, screenshot: Path, *, width: int = 1200, height: int = 3000, timeout_s: float = 120.0,
           attempts: int = 2) -> Rendered:
    """Screenshot ``html``; each attempt is bounded by ``timeout_s``. Headless Chromium now and then
    never exits after a screenshot that normally takes two seconds, so a timed-out attempt is
    killed with its process group and the page rendered again with a fresh profile, up to
    ``attempts`` times."""
    binary = find_chromium()
    if binary is None:
        raise BrowserError("chromium not found (Debian: apt-get install chromium)")
    url = Path(html).resolve().as_uri()
    attempts = max(1, attempts)
    for attempt in range(1, attempts + 1):
        done = _render_once(binary, url, Path(screenshot).resolve(), width, height, timeout_s)
        if done is not None:
            break
        if attempt == attempts:
            raise BrowserError(f"{url}: chromium did not finish within {timeout_s:g} s "
                               f"({attempts} attempt{'s' if attempts > 1 else ''})")
    returncode, log = done
    if returncode != 0 or not Path(screenshot).is_file():
        last = log.strip().splitlines()[-1:] or [f"exit {returncode}"]
        raise BrowserError(f"{url}: chromium failed: {last[0]}")
    console = tuple(m.group(1) for m in map(_CONSOLE.search, log.splitlines()) if m)
    return Rendered(Path(screenshot), console, log)


def _render_once(binary: str, url: str, screenshot: Path, width: int, height: int,
                 timeout_s: float) -> tuple[int, str] | None:
    """(exit code, log) of one Chromium run; None if it was killed at ``timeout_s``."""
    with tempfile.TemporaryDirectory(prefix="kistexp-chromium-") as profile:
        args = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                f"--user-data-dir={profile}", "--no-first-run", "--disable-extensions", "--disable-sync",
                "--disable-background-networking", "--disable-component-update", "--hide-scrollbars",
                "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
                f"--window-size={width},{height}", f"--screenshot={screenshot}", url]
        env = {**os.environ, "HOME": profile}  # nothing of the user's profile or caches is read or written
        # its own process group, so a hung renderer or GPU helper is ended with it
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, env=env, start_new_session=True)
        try:
            _out, log = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return None
    return proc.returncode, log


def dump_dom(html: Path, *, timeout_s: float = 120.0, attempts: int = 2, width: int | None = None,
             height: int | None = None) -> str:
    """The DOM of ``html`` as headless Chromium built it (``--dump-dom``), with the same throw-away
    profile, no network and time bound as ``render``; laid out in a ``width`` x ``height`` window
    when given (a page's script can then measure what fits)."""
    binary = find_chromium()
    if binary is None:
        raise BrowserError("chromium not found (Debian: apt-get install chromium)")
    url = Path(html).resolve().as_uri()
    for _attempt in range(max(1, attempts)):
        with tempfile.TemporaryDirectory(prefix="kistexp-chromium-") as profile:
            args = [binary, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                    "--no-first-run", "--disable-extensions", "--disable-sync", "--disable-background-networking",
                    "--disable-component-update", "--host-resolver-rules=MAP * ~NOTFOUND",
                    "--proxy-server=127.0.0.1:9"]
            if width and height:
                args.append(f"--window-size={width},{height}")
            args += ["--dump-dom", url]
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                    text=True, env={**os.environ, "HOME": profile}, start_new_session=True)
            try:
                out, log = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                continue
        if proc.returncode != 0 or "<html" not in out:
            last = log.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
            raise BrowserError(f"{url}: chromium failed: {last[0]}")
        return out
    raise BrowserError(f"{url}: chromium did not finish within {timeout_s:g} s")
