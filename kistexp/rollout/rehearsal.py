"""The rehearsal bench of dry runs and replays: embedded fake authorities on the virtual clock
(rollout.md §5).

``EmbeddedAuthorities`` starts ``fake_authorities`` in virtual mode (no sockets; every voting
phase a ``call_at`` on the ``VirtualClock``), one authority per configured nickname of the plan,
each with its own keys and the ConsensusParams the plan gives it before the baseline. They vote,
compute, sign and publish real documents every plan hour. The engine drives them exactly as
``kistexp run --authorities fake`` does: ``FakeAuthoritiesActuator`` through the operator API
(bearer token, in-process transport) to act, the directory client (signature checks at the
virtual time) to read votes and consensuses. ``ConsensusHistory`` fetches each published
consensus the same way, so the predicted metrics know which value nodes held at any hour.

``--inject authority=NAME:down@W`` and ``stale@W`` become the fake authorities' own faults
(``fake_authorities.faults``) at W on the clock: ``down`` (DirPort refuses, no vote, its
operator cannot reload it) and ``stale-vote`` (it keeps serving its old vote, the others refuse
it for its old valid-after).

``rehearse`` runs the engine on the virtual driver and plays the operator where a rehearsal
needs one: manual gates are approved by a journaled ``promote``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence

from kistexp.clock import VirtualClock
from kistexp.dirauth.keys import AuthorityKeys
from kistexp.errors import KistexpError
from kistexp.rollout.actuators import OWN_KEYS, FakeAuthoritiesActuator, Params
from kistexp.rollout.drivers import VirtualDriver
from kistexp.rollout.engine import Engine
from kistexp.rollout.journal import Journal
from kistexp.rollout.spec import RolloutSpec
from kistexp.rollout.state import PAUSED

#: Signing a seven-week plan's 1,176 rounds with live-size keys (3072/2048 bits) would cost
#: more than the whole rehearsal; 1024 bits is the floor tor accepts (keys.MIN_RSA_BITS), and
#: every signature is still made and checked.
KEY_BITS = 1024
_KEYS: dict[tuple[int, dt.datetime, dt.timedelta], list[AuthorityKeys]] = {}


def rehearsal_keys(count: int, published: dt.datetime, lifetime: dt.timedelta) -> list[AuthorityKeys]:
    """``count`` authority key sets with certificates current from ``published`` for ``lifetime``;
    made once per process for the same window (reruns and tests reuse them)."""
    key = (count, published, lifetime)
    if key not in _KEYS:
        if len(_KEYS) > 8:
            _KEYS.clear()
        _KEYS[key] = [AuthorityKeys.generate(published=published, lifetime=lifetime, identity_bits=KEY_BITS,
                                             signing_bits=KEY_BITS) for _ in range(count)]
    return _KEYS[key]


class ConsensusHistory:
    """The consensus each valid-after left nodes holding, as fetched through the directory client
    (signatures checked) one check delay after each valid-after on the clock. Nodes keep the
    newest consensus they have, so a round that published nothing leaves the one before."""

    def __init__(self, directory, clock: VirtualClock, spec: RolloutSpec, first_va: dt.datetime) -> None:
        self.directory, self.clock, self.spec = directory, clock, spec
        self._delay = dt.timedelta(seconds=spec.cadence.check_delay_s)
        self._seen: dict[dt.datetime, tuple[Params, list[str]]] = {}
        self._vas: list[dt.datetime] = []
        self._timer = clock.call_at(first_va + self._delay, self._fetch)

    def _fetch(self) -> None:
        try:
            doc = self.directory.fetch_consensus("microdesc")
        except KistexpError:
            doc = None  # no authority served a valid one: nodes keep what they hold
        if doc is not None and doc.valid_after not in self._seen:
            self._seen[doc.valid_after] = ({k: v for k, v in doc.params if k not in OWN_KEYS},
                                           [a.nickname for a in doc.authorities])
            self._vas.append(doc.valid_after)
        nxt = self.spec.cadence.next_va(self.clock.now() - self._delay)
        self._timer = self.clock.call_at(nxt + self._delay, self._fetch)

    def fetch_consensus(self, valid_after: dt.datetime) -> tuple[Params | None, list[str]]:
        import bisect

        i = bisect.bisect_right(self._vas, valid_after)
        if not i:
            return None, []
        params, signers = self._seen[self._vas[i - 1]]
        return dict(params), list(signers)

    def stop(self) -> None:
        self._timer.cancel()


class EmbeddedAuthorities:
    """The plan's authorities as fake authorities on ``clock`` (see the module docstring)."""

    def __init__(self, spec: RolloutSpec, clock: VirtualClock, initial: Mapping[str, Params],
                 until: dt.datetime, faults: tuple[tuple[str, str, dt.datetime], ...] = ()) -> None:
        from fake_authorities import FakeAuthorityNetwork
        from fake_authorities.faults import Fault
        from kistexp.directory import DirectoryClient

        interval = spec.cadence.interval_s
        if not float(interval).is_integer():
            raise KistexpError(f"a rehearsal needs whole-second voting intervals, not {interval} s")
        now = clock.now()
        published = now.replace(microsecond=0) - dt.timedelta(days=1)
        lifetime = max(dt.timedelta(days=365), until - published + dt.timedelta(days=1))
        keys = rehearsal_keys(len(spec.authorities), published, lifetime)
        self.net = FakeAuthorityNetwork(
            count=len(spec.authorities), interval_s=int(interval), listen=False, port=0,
            nicknames=list(spec.authorities), keys=keys, vote_delay_s=spec.cadence.vote_s,
            dist_delay_s=spec.cadence.dist_s, initial_params={a: dict(p) for a, p in initial.items()},
            clock=clock).start()
        transport = self.net.transport()
        # no retries: a retry's backoff would wait on the virtual clock, moving the authorities on
        # in the middle of an engine step; an unanswered fetch is an observation, as it is live
        # (identity only: in-process there is no wire for compression to save)
        self.directory = DirectoryClient(self.net.directory_authorities(), transport=transport, retries=0,
                                         clock=clock, accept_encodings=("identity",))
        self.actuator = FakeAuthoritiesActuator(self.net.operator_url, self.net.token, self.directory, clock,
                                                transport=transport)
        self.history = ConsensusHistory(self.directory, clock, spec, spec.cadence.va_at_or_after(now))
        kinds = {"down": "down", "stale": "stale-vote"}
        for name, kind, at in faults:
            fault = Fault(kinds[kind])
            clock.call_at(max(at, now), lambda n=name, f=fault: self.net.inject_fault(n, f))

    def close(self) -> None:
        self.history.stop()
        self.directory.close()
        self.net.stop()

    def __enter__(self) -> EmbeddedAuthorities:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def rehearsal_clock(spec: RolloutSpec) -> VirtualClock:
    """A virtual clock two rounds before the baseline, so the authorities have published the
    consensus valid at the baseline's start by the time the engine first looks."""
    return VirtualClock(spec.baseline_start - 2 * dt.timedelta(seconds=spec.cadence.interval_s))


def rehearse(engine: Engine, journal: Journal, clock: VirtualClock, *, until: dt.datetime, who: str,
             approve_gates: bool = True, progress: Callable[[float, str], None] | None = None,
             span: dt.timedelta | None = None, stop: Callable[[Engine], bool] | None = None,
             commands: Sequence[tuple[dt.datetime, str, dict, str]] = ()) -> None:
    """Run ``engine`` on the virtual driver until ``until`` (or terminal, or ``stop``); a manual
    gate is approved by a journaled ``promote`` from ``who`` unless ``approve_gates`` is False;
    ``progress(fraction of span, status)`` after each step. ``commands`` are operator commands
    ``(at, kind, args, user)`` queued in the journal at their virtual time, in time order, and
    handled by the engine at once, as a live run handles ``kistexp pause DIR``."""
    start = engine.spec.baseline_start
    span = span or (until - start)

    def operator(eng: Engine) -> None:
        if progress is not None:
            progress(min(1.0, max(0.0, (clock.now() - start) / span)), eng.status.describe())
        if approve_gates and eng.status.state == PAUSED and eng.status.reasons == {"gate"}:
            journal.queue_command("promote", {}, who, clock.now())
            eng.step(clock.now())

    driver = VirtualDriver(engine, clock)
    for at, kind, args, user in sorted(commands, key=lambda c: c[0]):
        if at > until:
            break
        # the driver stops at the command's time (not at the engine's next event after it),
        # so the command acts when the operator would have typed it
        driver.run(until=at, on_step=operator, stop=stop)
        if engine.status.terminal or (stop is not None and stop(engine)):
            return
        if clock.now() < at:
            clock.run_until(at)
        journal.queue_command(kind, args, user, at)
        engine.step(at)
        operator(engine)
    driver.run(until=until, on_step=operator, stop=stop)
