"""Which consensus each node of a local network holds, watched over its ControlPort (the exposure
check of a params experiment: a relay or client that still holds the previous consensus, or pins
the parameter in its torrc, was not exposed to the new value).

Every ``period_s`` each watched node answers three questions (real-tor.md, "To read params over
the control port"):

* ``GETINFO consensus/valid-after``: which consensus it holds;
* the ``params`` line of that consensus, from ``GETINFO dir/status-vote/current/consensus-microdesc``
  (relays and microdescriptor clients), else ``.../consensus`` (ns clients). There is no
  ``consensus/params`` key. A new ``params`` line only ever comes with a new valid-after, so the
  document is fetched only when the valid-after changes;
* ``GETCONF KISTSchedRunInterval``: a relay that sets it in its torrc never reads the consensus
  value (kist-ewma.md §5.1); tor's default ``0`` (``"0 msec"``) means "use the consensus".

Each change of a node's answer (or of its reachability) is one JSON line in
``<out_dir>/<node>.held-consensus.jsonl`` and one entry of an in-memory history that
``held(node, at)`` and ``snapshot(at)`` search. A node whose tor does not answer is recorded as
unreachable with the reason, never raised. Every poll of a node runs in a worker thread and is
waited for at most ``call_timeout_s``: a tor that hangs (stopped, swapping) makes that node
unreachable for the watch, not the watch late for the others.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from types import MappingProxyType

import attrs

from kistexp import jsonout
from kistexp.dirauth.paramsline import ConsensusParams
from kistexp.errors import DocumentError, LocalNetError
from kistexp.localnet.control import ControlPort

#: The option whose torrc value overrides the consensus on relays and clients alike.
PINNED_OPTION = "KISTSchedRunInterval"
CONSENSUS_KEYS = ("dir/status-vote/current/consensus-microdesc", "dir/status-vote/current/consensus")
DEFAULT_PERIOD_S = 1.0
#: A whole poll of one node (connect, authenticate, two or three commands) on loopback takes a
#: few ms; a tor that needs longer than this is busy enough to count as not answering.
DEFAULT_CALL_TIMEOUT_S = 3.0
#: Changes kept per node in memory: one per consensus (every voting interval, 10 s at the
#: least) is 8640 a day; older ones remain in the JSON-lines file.
MAX_HISTORY = 20_000
#: A consensus document's header, where ``params`` is, lies within its first few KiB; a huge one
#: is not searched past this.
PARAMS_SEARCH_CHARS = 64 * 1024


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# a line of the watch's file: epoch seconds, tor's own time format, the torrc option the pin is of
@jsonout.shape(rename={"observed_at": "time", "pinned_ms": f"pinned_{PINNED_OPTION}"},
               fields={"observed_at": lambda t: t.timestamp(),
                       "valid_after": lambda t: t.strftime("%Y-%m-%d %H:%M:%S") if t else None})
@attrs.frozen
class HeldConsensus:
    """What one node held when the watch asked it.

    ``valid_after`` is None while the node has no consensus yet; ``pinned_ms`` is the torrc
    ``KISTSchedRunInterval`` in ms (None: not pinned, the consensus value applies). An
    unreachable node has ``reachable`` False and ``problem`` saying why, and nothing else known.
    ``observed_at`` is when the watch first saw this state: the change happened within one
    period before it.
    """

    node: str
    observed_at: dt.datetime
    reachable: bool
    valid_after: dt.datetime | None = None
    params: Mapping[str, int] = attrs.field(factory=dict, converter=lambda m: MappingProxyType(dict(m)),
                                            hash=False)
    pinned_ms: int | None = None
    problem: str = ""

    def param(self, name: str) -> int | None:
        """The consensus value of ``name``, None when the params line does not carry it."""
        return self.params.get(name)

    def same_state(self, other: HeldConsensus | None) -> bool:
        return other is not None and (self.reachable, self.valid_after, dict(self.params), self.pinned_ms,
                                      self.problem) == (other.reachable, other.valid_after, dict(other.params),
                                                        other.pinned_ms, other.problem)


def parse_valid_after(text: str) -> dt.datetime:
    """tor's ``YYYY-MM-DD HH:MM:SS`` (UTC) as an aware datetime."""
    try:
        return dt.datetime.strptime(text.strip(), "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        raise LocalNetError(f"consensus/valid-after {text[:40]!r} is not 'YYYY-MM-DD HH:MM:SS'") from None


def params_of(document: str, where: str) -> dict[str, int]:
    """The ``params`` line of a consensus document as a dict; {} when it has none (no authority
    voted any)."""
    for line in document[:PARAMS_SEARCH_CHARS].splitlines():
        if line.startswith("params ") or line == "params":
            try:
                return ConsensusParams.parse(line, f"{where}: params line").as_dict()
            except DocumentError as exc:
                raise LocalNetError(str(exc)) from None
        if line.startswith("dir-source ") or line.startswith("r "):
            break  # past the header: there is no params line
    return {}


def parse_pinned(values: Sequence[str], where: str) -> int | None:
    """GETCONF KISTSchedRunInterval -> ms, None when not pinned (tor's ``0``/``0 msec``)."""
    if not values:
        return None
    text = values[-1].strip()
    number, _, unit = text.partition(" ")
    if not number.isascii() or not number.isdecimal() or unit.strip().lower() not in ("", "msec", "ms",
                                                                                      "millisecond", "milliseconds"):
        raise LocalNetError(f"{where}: GETCONF {PINNED_OPTION} answered {text[:40]!r}, not a number of msec")
    value = int(number)
    return value or None


class HeldConsensusWatch:
    """Polls ``nodes`` of ``net`` (nicknames) every ``period_s``; see the module docstring.

    ``start()`` runs the polling in a thread, ``stop(timeout_s)`` ends it within its bound;
    ``poll_once()`` does one round synchronously (each node bounded by ``call_timeout_s``).
    """

    def __init__(self, net, nodes: Iterable[str], out_dir: Path | str, *, period_s: float = DEFAULT_PERIOD_S,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> None:
        if period_s <= 0 or call_timeout_s <= 0:
            raise LocalNetError("the held-consensus watch needs a positive period and call timeout")
        self.net = net
        self.nodes = tuple(dict.fromkeys(net.node(n).nickname for n in nodes))
        if not self.nodes:
            raise LocalNetError("the held-consensus watch was given no nodes to watch")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.period_s = float(period_s)
        self.call_timeout_s = float(call_timeout_s)
        self._lock = threading.Lock()
        self._history: dict[str, deque[HeldConsensus]] = {n: deque(maxlen=MAX_HISTORY) for n in self.nodes}
        self._controls: dict[str, ControlPort] = {}
        self._valid_after: dict[str, dt.datetime] = {}
        self._params: dict[str, dict[str, int]] = {}
        self._pending: dict[str, Future] = {}
        self._pool = ThreadPoolExecutor(max_workers=len(self.nodes), thread_name_prefix="held-consensus")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def path(self, node: str) -> Path:
        return self.out_dir / f"{node}.held-consensus.jsonl"

    # ---- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise LocalNetError("the held-consensus watch is already running")
        self._thread = threading.Thread(target=self._run, name="held-consensus-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.poll_once()
            next_at += self.period_s
            # a round that overran its period starts the next one at once, without a backlog
            next_at = max(next_at, time.monotonic())
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the polling and close every control connection; returns within ``timeout_s``."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            controls, self._controls = list(self._controls.values()), {}
        for ctl in controls:
            _close_quietly(ctl)  # also wakes a worker blocked on that connection
        self._pool.shutdown(wait=False, cancel_futures=True)
        # the pool's threads end once their call returns (closing the connections above ends a
        # blocked one); wait for them within what is left of the bound, in a thread of its own
        joiner = threading.Thread(target=self._pool.shutdown, kwargs={"wait": True}, name="held-consensus-join",
                                  daemon=True)
        joiner.start()
        joiner.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> HeldConsensusWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- polling ----------------------------------------------------------------------

    def poll_once(self) -> dict[str, HeldConsensus]:
        """Ask every node once (in parallel, each bounded); record and return what each holds."""
        now = _utc_now()
        started: dict[str, Future] = {}
        for node in self.nodes:
            busy = self._pending.get(node)
            if busy is not None and not busy.done():
                continue  # still blocked from an earlier round: it stays unreachable meanwhile
            try:
                started[node] = self._pool.submit(self._ask, node)
            except RuntimeError:  # the pool was shut down by stop()
                return {}
            self._pending[node] = started[node]
        deadline = time.monotonic() + self.call_timeout_s
        out: dict[str, HeldConsensus] = {}
        for node in self.nodes:
            future = started.get(node)
            if future is None:
                state = self._unreachable(node, now, f"{node}: no answer from its ControlPort within "
                                                     f"{self.call_timeout_s:g} s (an earlier poll is still waiting)")
            else:
                try:
                    state = future.result(timeout=max(0.0, deadline - time.monotonic()))
                except FutureTimeout:
                    state = self._unreachable(node, now, f"{node}: no answer from its ControlPort within "
                                                         f"{self.call_timeout_s:g} s")
                    self._drop_control(node)
                except Exception as exc:  # one node's surprise must not end the watch
                    state = self._unreachable(node, now, f"{node}: {type(exc).__name__}: {exc}")
                    self._drop_control(node)
            self._record(state)
            out[node] = state
        return out

    def _unreachable(self, node: str, now: dt.datetime, why: str) -> HeldConsensus:
        return HeldConsensus(node, now, False, problem=why.splitlines()[0] if why else "unreachable")

    def _control(self, node: str) -> ControlPort:
        with self._lock:
            ctl = self._controls.get(node)
        if ctl is not None and ctl.controller.is_alive():
            return ctl
        if ctl is not None:
            self._drop_control(node)
        ctl = self.net.control(node)
        with self._lock:
            if self._stop.is_set():
                _close_quietly(ctl)
                raise LocalNetError(f"{node}: the watch is stopping")
            self._controls[node] = ctl
        return ctl

    def _drop_control(self, node: str) -> None:
        with self._lock:
            ctl = self._controls.pop(node, None)
        if ctl is not None:
            # closing may wait for stem's threads; a worker thread does it, never the polling loop
            threading.Thread(target=_close_quietly, args=(ctl,), name="held-consensus-close", daemon=True).start()

    def _ask(self, node: str) -> HeldConsensus:
        """One node's answers (runs in a worker thread). LocalNetError -> unreachable."""
        now = _utc_now()
        try:
            ctl = self._control(node)
            try:
                valid_after: dt.datetime | None = parse_valid_after(ctl.get_info("consensus/valid-after"))
            except LocalNetError:
                if not ctl.controller.is_alive():
                    raise
                # a tor that has no consensus yet refuses the key ("551 ... not available"): it holds none
                valid_after = None
            params: dict[str, int] = {}
            if valid_after is not None:
                if self._valid_after.get(node) == valid_after and node in self._params:
                    params = self._params[node]
                else:
                    params = self._fetch_params(ctl, node)
                    self._params[node] = params
                    self._valid_after[node] = valid_after
            pinned = parse_pinned(ctl.get_conf(PINNED_OPTION), node)
        except LocalNetError as exc:
            self._drop_control(node)
            return self._unreachable(node, now, str(exc))
        return HeldConsensus(node, now, True, valid_after, params, pinned)

    def _fetch_params(self, ctl: ControlPort, node: str) -> dict[str, int]:
        last: LocalNetError | None = None
        for key in CONSENSUS_KEYS:
            try:
                return params_of(ctl.get_info(key), f"{node} GETINFO {key}")
            except LocalNetError as exc:
                if not ctl.controller.is_alive():
                    raise
                last = exc  # this flavour is not cached here: try the other one
        raise last or LocalNetError(f"{node}: no consensus document over the ControlPort")

    # ---- record and query -----------------------------------------------------------------

    def _record(self, state: HeldConsensus) -> None:
        with self._lock:
            history = self._history[state.node]
            if history and state.same_state(history[-1]):
                return
            history.append(state)
        try:
            with self.path(state.node).open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(jsonout.to_json(state), sort_keys=True) + "\n")
        except OSError:
            pass  # the in-memory history still answers; a full disk must not stop the watch

    def history(self, node: str) -> tuple[HeldConsensus, ...]:
        """Every recorded change of ``node``, oldest first (the last MAX_HISTORY)."""
        with self._lock:
            return tuple(self._history[self.net.node(node).nickname])

    def state(self, node: str, at: dt.datetime | None = None) -> HeldConsensus | None:
        """The last recorded state of ``node`` at or before ``at`` (default: now), unreachable
        ones included; None before the first poll."""
        name = self.net.node(node).nickname
        if name not in self._history:
            raise LocalNetError(f"{name} is not watched (watched: {', '.join(self.nodes)})")
        with self._lock:
            history = list(self._history[name])
        if at is None:
            return history[-1] if history else None
        found = None
        for entry in history:
            if entry.observed_at > at:
                break
            found = entry
        return found

    def held(self, node: str, at: dt.datetime | None = None) -> HeldConsensus | None:
        """What ``node`` held at ``at`` (default: now): None when not yet known, or when the node
        was not answering then (what it held is unknown)."""
        state = self.state(node, at)
        return state if state is not None and state.reachable else None

    def snapshot(self, at: dt.datetime | None = None) -> dict[str, HeldConsensus | None]:
        """``held`` for every watched node."""
        return {node: self.held(node, at) for node in self.nodes}


def _close_quietly(ctl: ControlPort) -> None:
    try:
        ctl.close()
    except Exception:  # closing a connection to a dead tor may fail in many ways
        pass


__all__ = ["HeldConsensus", "HeldConsensusWatch", "params_of", "parse_pinned", "parse_valid_after"]
