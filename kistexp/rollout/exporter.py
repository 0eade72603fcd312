"""A Prometheus exporter of a rollout, read from its journal at each scrape (docs/watching.md).

``kistexp run ... --metrics-port PORT [--metrics-address ADDR]`` serves ``/metrics`` from its own
``CollectorRegistry`` (never prometheus_client's global one, which would add the process's own
metrics and outlive the run) with one custom collector: each scrape opens the experiment database
read-only, reads the status, the latest verdicts, intents, rounds' authority health, metric gaps
and exposure rows, and closes it. Tables and columns a newer schema adds are read when present, so
the exporter shows whatever the journal holds and never writes to it.
"""

from __future__ import annotations

import errno
import socket
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from kistexp.errors import KistexpError
from kistexp.rollout.journal import (
    INTENT_STATES,
    JournalDamageError,
    JournalMeta,
    JournalReader,
    JournalTooNewError,
    consensus_outages,
)
from kistexp.rollout.state import OUTCOMES, PAUSE_REASONS, STATES
from kistexp.textsafe import visible

PREFIX = "kistexp_rollout"


class ExporterError(KistexpError):
    """The exporter cannot listen where it was asked to."""


class JournalCollector(Collector):
    """Collects the rollout's metrics from the journal of ``exp_path`` at each scrape."""

    def __init__(self, exp_path: Path | str) -> None:
        self.exp_path = Path(exp_path)
        self._spec_key: tuple | None = None
        self._spec = None

    def describe(self) -> list[Metric]:
        return []  # registering must not read the journal; every metric comes from collect()

    def _load_spec(self, meta: JournalMeta):
        """The spec from the plan copy, loaded again only when the plan of record changes."""
        from kistexp.rollout.runs import load_spec

        plan = self.exp_path / "plan.toml"
        try:
            key = (meta.get("plan_canon_sha256"), meta.get("cadence"), meta.get("start"), plan.stat().st_mtime_ns)
        except OSError:
            return None
        if key != self._spec_key:
            try:
                self._spec = load_spec(self.exp_path)[0]
            except JournalDamageError:
                raise  # the scrape says the journal is damaged, never leaves the plan's metrics out quietly
            except (KistexpError, OSError):
                self._spec = None
            self._spec_key = key
        return self._spec

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(f"{PREFIX}_up", "1 when the experiment's rollout journal could be read")
        try:
            reader = JournalReader.of_experiment(self.exp_path)
        except KistexpError as exc:  # no database yet, no journal in it, or a damaged one
            up.add_metric([], 0)
            yield up
            yield from _damage(exc)
            return
        try:
            with reader.snapshot():  # one snapshot per scrape
                families = list(self._families(reader))
        except (sqlite3.Error, KistexpError) as exc:  # busy a moment (read again next scrape), or damaged
            up.add_metric([], 0)
            yield up
            yield from _damage(exc)
            return
        finally:
            reader.close()
        up.add_metric([], 1)
        yield up
        yield from families

    def _families(self, reader: JournalReader) -> Iterator[Metric]:
        meta = reader.meta()
        spec = self._load_spec(meta)
        info = GaugeMetricFamily(f"{PREFIX}_info", "The experiment this exporter reads",
                                 labels=["experiment", "plan", "mode"])
        info.add_metric([meta.get("experiment_id", ""), spec.plan_name if spec else "", meta.get("mode", "")], 1)
        yield info

        status = reader.latest_status()
        state = GaugeMetricFamily(f"{PREFIX}_state", "1 for the rollout's current state", labels=["state"])
        current = status.state if status is not None else "PENDING"  # no status row yet: not started
        for s in STATES:
            state.add_metric([s], 1 if current == s else 0)
        yield state
        stage = GaugeMetricFamily(f"{PREFIX}_stage", "The stage whose values are in force or being brought in "
                                  "(0 = baseline)", labels=["name"])
        if status is not None:
            name = "baseline" if status.stage == 0 else (
                spec.stage(status.stage).name if spec and status.stage <= spec.last_stage else str(status.stage))
            stage.add_metric([name], status.stage)
        yield stage
        reasons = GaugeMetricFamily(f"{PREFIX}_pause_reason", "1 for each reason the rollout is paused",
                                    labels=["reason"])
        for r in PAUSE_REASONS:
            reasons.add_metric([r], 1 if status is not None and r in status.reasons else 0)
        yield reasons
        if status is not None:
            for name, value, what in (
                    ("extensions", status.extensions, "Hours the current stage has been extended (hold rule)"),
                    ("rounds_waited", status.rounds_waited, "Consensuses published without the awaited values"),
                    ("rounds_missing", status.rounds_missing, "Rounds with no consensus while a transition waits")):
                g = GaugeMetricFamily(f"{PREFIX}_{name}", what)
                g.add_metric([], value)
                yield g
            for name, when, what in (
                    ("decision_timestamp_seconds", status.decision_at, "When the current stage's decision is due"),
                    ("awaiting_consensus_timestamp_seconds", status.target_va, "Valid-after of the consensus awaited"),
                    ("stage_valid_after_timestamp_seconds", status.stage_va, "Valid-after that brought the stage in")):
                if when is not None:
                    g = GaugeMetricFamily(f"{PREFIX}_{name}", what)
                    g.add_metric([], when.timestamp())
                    yield g

        yield from self._verdicts(reader, spec)
        yield from self._intents(reader)
        yield from self._health(reader, spec)
        yield from self._gaps(reader)
        yield from self._exposure(reader)
        yield from self._runs(reader)

    def _verdicts(self, reader: JournalReader, spec) -> Iterator[Metric]:
        from kistexp.judge.model import effect_limit

        latest = reader.latest_verdicts()
        verdict = GaugeMetricFamily(f"{PREFIX}_criterion_verdict", "1 for each criterion's latest outcome",
                                    labels=["criterion", "outcome"])
        scale = "the judge's scale: ratio stage/baseline for relative comparisons, difference for absolute ones"
        effect = GaugeMetricFamily(f"{PREFIX}_criterion_effect", f"Latest effect estimate ({scale})",
                                   labels=["criterion"])
        low = GaugeMetricFamily(f"{PREFIX}_criterion_effect_low", "Latest interval's lower end", labels=["criterion"])
        high = GaugeMetricFamily(f"{PREFIX}_criterion_effect_high", "Latest interval's upper end",
                                 labels=["criterion"])
        limit = GaugeMetricFamily(f"{PREFIX}_criterion_limit", f"The criterion's limit ({scale})",
                                  labels=["criterion"])
        look = GaugeMetricFamily(f"{PREFIX}_criterion_look_timestamp_seconds", "End of the window of the latest "
                                 "look", labels=["criterion"])
        names = list(dict.fromkeys([*(c.name for c in spec.criteria), *latest] if spec else latest))
        for name in names:
            r = latest.get(name)
            for o in OUTCOMES:
                verdict.add_metric([name, o], 1 if r is not None and r.outcome == o else 0)
            if r is not None:
                look.add_metric([name], r.window_end.timestamp())
                for fam, value in ((effect, r.effect), (low, r.ci_low), (high, r.ci_high)):
                    if value is not None:
                        fam.add_metric([name], value)
            if spec is not None:
                c = next((c for c in spec.criteria if c.name == name), None)
                if c is not None:
                    limit.add_metric([name], effect_limit(c.comparison, c.threshold))
        yield from (verdict, effect, low, high, limit, look)

    def _intents(self, reader: JournalReader) -> Iterator[Metric]:
        counts = reader.intent_counts()
        fam = GaugeMetricFamily(f"{PREFIX}_intents", "Intents by state", labels=["state"])
        for s in INTENT_STATES:
            fam.add_metric([s], counts.get(s, 0))
        yield fam

    def _health(self, reader: JournalReader, spec) -> Iterator[Metric]:
        authorities = tuple(spec.authorities) if spec is not None else reader.vote_authorities()
        rounds = reader.round_health(authorities)
        good = [r for r in rounds if r.majority]
        va = GaugeMetricFamily(f"{PREFIX}_consensus_valid_after_timestamp_seconds",
                               "Valid-after of the last majority-signed consensus seen")
        param = GaugeMetricFamily(f"{PREFIX}_consensus_param", "The plan's parameters in the last majority-signed "
                                  "consensus seen", labels=["param"])
        signers = GaugeMetricFamily(f"{PREFIX}_consensus_signers", "Authorities that signed the last consensus seen")
        if good:
            last = good[-1]
            va.add_metric([], last.valid_after.timestamp())
            params = dict(last.params or ())
            for p in (spec.parameters if spec is not None else sorted(params)):
                if p in params:
                    param.add_metric([p], params[p])
            signers.add_metric([], len(last.signed))
        yield from (va, param, signers)
        voted = GaugeMetricFamily(f"{PREFIX}_authority_voted", "1 if the authority's vote was seen in the last round "
                                  "whose votes were fetched", labels=["authority"])
        signed = GaugeMetricFamily(f"{PREFIX}_authority_signed", "1 if the authority signed the last consensus "
                                   "checked", labels=["authority"])
        with_votes = [r for r in rounds if r.votes_checked]
        if with_votes:
            last = with_votes[-1]
            for a in authorities:
                voted.add_metric([a], 1 if a in last.voted else 0)
        checked = [r for r in rounds if r.consensus != "unchecked"]
        if checked and (checked[-1].signed or not checked[-1].majority):
            for a in authorities:
                signed.add_metric([a], 1 if a in checked[-1].signed else 0)
        yield from (voted, signed)
        last_round = GaugeMetricFamily(f"{PREFIX}_last_round_timestamp_seconds",
                                       "Valid-after of the newest round with votes or a consensus seen")
        if rounds:
            last_round.add_metric([], rounds[-1].valid_after.timestamp())
        yield last_round
        outages = consensus_outages(rounds, spec.hour if spec is not None else None)
        without = GaugeMetricFamily(f"{PREFIX}_rounds_without_majority_consensus",
                                    "Rounds in the current stretch without a majority-signed consensus (0: none)")
        without.add_metric([], outages[-1].rounds if outages and outages[-1].ongoing else 0)
        yield without
        stretches = CounterMetricFamily(f"{PREFIX}_consensus_outages", "Stretches of rounds without a "
                                        "majority-signed consensus")
        stretches.add_metric([], len(outages))
        yield stretches

    def _gaps(self, reader: JournalReader) -> Iterator[Metric]:
        gaps = reader.gaps_by_source()
        fam = CounterMetricFamily(f"{PREFIX}_metric_gaps", "Collection windows (or instance polls) that delivered "
                                  "nothing, by source", labels=["source"])
        for source, n in sorted(gaps.items()):
            fam.add_metric([source], n)
        yield fam

    def _exposure(self, reader: JournalReader) -> Iterator[Metric]:
        share = GaugeMetricFamily(f"{PREFIX}_exposure_share", "Share of the population running the stage's values "
                                  "at the latest exposure row", labels=["population", "kind"])
        short = GaugeMetricFamily(f"{PREFIX}_exposure_short", "1 when the latest exposure falls short of the "
                                  "prediction", labels=["population"])
        for pop, e in sorted(reader.latest_exposure().items()):
            for kind, value in (("expected", e.expected_share), ("observed", e.observed_share)):
                if value is not None:
                    share.add_metric([pop, kind], value)
            short.add_metric([pop], 1 if e.short else 0)
        yield from (share, short)

    def _runs(self, reader: JournalReader) -> Iterator[Metric]:
        active = GaugeMetricFamily(f"{PREFIX}_run_active", "1 while a run's row is open (a run drives the rollout)")
        active.add_metric([], 1 if reader.open_runs() else 0)
        yield active
        owner = reader.owner()
        if owner is not None:
            g = GaugeMetricFamily(f"{PREFIX}_heartbeat_timestamp_seconds", "The running owner's last heartbeat")
            g.add_metric([], owner.heartbeat.timestamp())
            yield g


def _damage(exc: BaseException) -> Iterator[Metric]:
    """For a damaged journal (or one a newer kistexp wrote), what is wrong (the one line naming the table
    and row) as a label: whoever looks at why the exporter is down reads it there."""
    if isinstance(exc, (JournalDamageError, JournalTooNewError)):
        fam = GaugeMetricFamily(f"{PREFIX}_journal_damaged", "1 when the journal holds what this kistexp cannot "
                                "read", labels=["problem"])
        fam.add_metric([visible(str(exc))], 1)
        yield fam


def registry_for(exp_path: Path | str) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JournalCollector(exp_path))
    return registry


class Exporter:
    """The HTTP server of ``/metrics`` on its own thread; ``close()`` stops it and frees the port."""

    def __init__(self, exp_path: Path | str, port: int, address: str = "127.0.0.1") -> None:
        from prometheus_client import start_http_server

        if not 0 <= port <= 65535:
            raise ExporterError(f"--metrics-port {port}: not a TCP port (0-65535)")
        self.registry = registry_for(exp_path)
        try:
            self._server, self._thread = start_http_server(port, addr=address, registry=self.registry)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ExporterError(f"--metrics-port {port}: {address}:{port} is already in use; pick another "
                                    "port (or 0 for any free one)") from None
            if isinstance(exc, socket.gaierror) or exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                raise ExporterError(f"--metrics-address {address!r}: cannot listen there ({exc.strerror or exc})"
                                    ) from None
            raise ExporterError(f"--metrics-port {port} on {address}: cannot listen ({exc.strerror or exc})"
                                ) from None
        self.address = address
        self.port = self._server.server_address[1]
        self._closed = threading.Event()

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

