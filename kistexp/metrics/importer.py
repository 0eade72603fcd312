"""Import sources into an experiment's metric store: detect each source's kind, run its
collector, store the samples (and consensus history), and say what was left out.

Kinds (``KINDS``): onionperf (OnionPerf or tgen analysis JSON, plain or .xz),
operator-report (CSV), consensus-archive (file, directory or CollecTor tarball),
metricsport (a relay's MetricsPort URL), prometheus (a process-exporter URL), proc
(``proc:PID``, a local tor process). The live kinds are scraped ``scrapes`` times,
``interval_s`` apart, because their samples are changes between scrapes.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs

from kistexp.clock import RealClock
from kistexp.errors import KistexpError
from kistexp.metrics.collectors import Collected, group_samples
from kistexp.metrics.series import Sample
from kistexp.metrics.store import MetricStore

KINDS = ("onionperf", "operator-report", "consensus-archive", "metricsport", "prometheus", "proc")


class SourceKindError(KistexpError):
    """A source whose kind cannot be told or whose options are wrong."""


@attrs.frozen
class ImportOptions:
    labels: Mapping[str, str] = attrs.field(factory=dict, hash=False)  # added to every sample
    param_value: int | None = None  # the consensus value in effect for every sample, if known
    param_name: str | None = None  # else: derive it per sample from the stored consensus history
    honour_filters: bool = False  # OnionPerf: drop transfers/circuits the file's filters exclude
    certificates: Path | None = None  # consensus archives: key certificates (e.g. cached-certs)
    trusted: tuple[str, ...] | None = None  # consensus archives: trusted v3idents (default: today's nine)
    consensus: Path | None = None  # operator reports: refuse fingerprints not in this consensus
    scrapes: int = 2  # live kinds
    interval_s: float = 10.0
    group: str = "tor"  # prometheus kind: process-exporter group name


@attrs.frozen
class ImportResult:
    kind: str
    location: str
    samples: Mapping[str, int] = attrs.field(hash=False)  # metric -> samples stored
    problems: tuple[str, ...] = ()
    consensuses: int = 0
    votes: int = 0
    skipped: int = 0

    @property
    def n_samples(self) -> int:
        return sum(self.samples.values())


def detect_kind(source: str) -> str:
    """The kind of a source from its form and, for files, its first bytes."""
    if re.match(r"^https?://", source):
        return "metricsport"
    if source.startswith("proc:"):
        return "proc"
    path = Path(source)
    if path.is_dir():
        return "consensus-archive"
    name = path.name.lower()
    if name.endswith((".tar", ".tar.xz", ".tar.bz2", ".tar.gz")):
        return "consensus-archive"
    if name.endswith(".csv"):
        return "operator-report"
    if name.endswith((".json", ".json.xz")):
        return "onionperf"
    if not path.exists():
        raise SourceKindError(f"{source}: no such file, directory or URL")
    try:
        with path.open("rb") as fh:
            head = fh.read(256)
    except OSError as exc:
        raise SourceKindError(f"{source}: cannot read: {exc.strerror or exc}") from None
    if head.startswith((b"network-status-version 3", b"@type network-status", b"dir-key-certificate")):
        return "consensus-archive"
    if head.startswith(b"\xfd7zXZ\x00") or head.lstrip().startswith(b"{"):
        return "onionperf"
    if head.startswith(b"relay_fingerprint"):
        return "operator-report"
    raise SourceKindError(f"{source}: cannot tell what kind of source this is; give --kind ({', '.join(KINDS)})")


def _with(collected: Collected, opts: ImportOptions) -> Collected:
    if not opts.labels and opts.param_value is None:
        return collected
    pairs = []
    for metric, samples in collected.samples.items():
        for s in samples:
            labels = {**s.labels, **opts.labels}
            pv = s.param_value if opts.param_value is None else opts.param_value
            pairs.append((metric, Sample(s.time, s.value, labels, pv)))
    return attrs.evolve(collected, samples=group_samples(pairs))


def _in_effect(store: MetricStore, collected: Collected, name: str) -> Collected:
    from kistexp import params
    from kistexp.metrics import in_effect

    history = store.consensuses()
    if not history:
        raise SourceKindError(f"{collected.location}: --param {name}: the experiment holds no consensuses to tell "
                              "the value in effect; import a consensus archive first")
    known = params.get(name)
    default = known.bounds[-1].default if known else None  # absent key: today's tor default
    return attrs.evolve(collected, samples={
        metric: tuple(in_effect.assign(metric, samples, history, name, default=default))
        for metric, samples in collected.samples.items()})


def _live(kind: str, source: str, opts: ImportOptions, clock) -> Collected:
    from kistexp.metrics.collectors import metricsport, process

    if opts.scrapes < 2:
        raise SourceKindError(f"{source}: --scrapes must be at least 2 (samples are changes between scrapes)")
    if kind == "metricsport":
        poller = metricsport.MetricsPortCollector(source, {}, clock=clock)
    elif kind == "prometheus":
        poller = process.ExporterCollector(source, opts.group, {}, clock=clock)
    else:
        pid = source.split(":", 1)[1]
        if not pid.isdigit():
            raise SourceKindError(f"{source}: expected proc:PID")
        poller = process.ProcessSampler(int(pid), {}, clock=clock)
    pairs = []
    for i in range(opts.scrapes):
        if i:
            clock.sleep_until(clock.now() + dt.timedelta(seconds=opts.interval_s))
        pairs.extend(poller.poll())
    return Collected(kind, source, group_samples(pairs))


def collect(kind: str, source: str, opts: ImportOptions, clock=None) -> Collected:
    """Run the collector of ``kind`` on ``source`` (not for consensus archives)."""
    clock = clock or RealClock()
    if kind == "onionperf":
        from kistexp.metrics.collectors import onionperf

        return onionperf.collect(source, honour_filters=opts.honour_filters, now=clock.now())
    if kind == "operator-report":
        from kistexp.metrics.collectors import operator_report

        known = operator_report.known_relays(opts.consensus) if opts.consensus else None
        return operator_report.collect(source, known=known, now=clock.now())
    if kind in ("metricsport", "prometheus", "proc"):
        return _live(kind, source, opts, clock)
    raise SourceKindError(f"{source}: unknown kind {kind!r} (known: {', '.join(KINDS)})")


def import_source(store: MetricStore, source: str, kind: str | None = None, opts: ImportOptions = ImportOptions(),
                  clock=None, on_item: Callable[[int, str], None] | None = None) -> ImportResult:
    """Import one source. Raises (CorruptSource, ScrapeError, ...) if nothing of it can
    be used; otherwise stores its good records and returns the problems of the rest.
    ``on_item(n, location)`` reports progress through an archive's files."""
    clock = clock or RealClock()
    kind = kind or detect_kind(source)
    if kind not in KINDS:
        raise SourceKindError(f"{source}: unknown kind {kind!r} (known: {', '.join(KINDS)})")
    if kind == "consensus-archive":
        return _import_archive(store, source, opts, on_item)
    collected = _with(collect(kind, source, opts, clock), opts)
    if opts.param_name and opts.param_value is None:
        collected = _in_effect(store, collected, opts.param_name)
    sid = store.record_source(kind, collected.location, collected.sha256, now=clock.now())
    counts = {}
    for metric, samples in collected.samples.items():
        counts[metric] = store.add_samples(metric, samples, source_id=sid)
    store.update_source(sid, n_samples=sum(counts.values()), n_rejected=len(collected.problems),
                        problems=collected.problems)
    return ImportResult(kind, collected.location, counts, collected.problems)


def _import_archive(store: MetricStore, source: str, opts: ImportOptions,
                    on_item: Callable[[int, str], None] | None) -> ImportResult:
    from kistexp.dirauth.documents import load_key_certificates
    from kistexp.metrics.collectors import consensus_archive

    certs = load_key_certificates(opts.certificates) if opts.certificates else ()
    got = consensus_archive.read_archive(source, certificates=certs, trusted=opts.trusted, progress=on_item)
    consensus_archive.save(store, got)
    store.record_source("consensus-archive", source, None, n_samples=0, n_rejected=len(got.problems),
                        problems=got.problems)
    return ImportResult("consensus-archive", source, {}, got.problems, len(got.consensuses), len(got.votes),
                        got.skipped)


def import_all(store: MetricStore, sources: Sequence[str], kind: str | None = None,
               opts: ImportOptions = ImportOptions(), clock=None,
               progress: Callable[[int, int, str], None] | None = None,
               ) -> tuple[list[ImportResult], list[str]]:
    """Import each source; one that fails as a whole is reported and the others still
    imported. Returns the results and the one-line errors of the failed sources.
    ``progress(done, total, what)`` is called per source and per archive file."""
    results, errors = [], []
    for i, source in enumerate(sources):
        if progress:
            progress(i, len(sources), source)
        item = None
        if progress:
            def item(n: int, where: str, i: int = i) -> None:
                progress(i, len(sources), f"{where} ({n} files)")
        try:
            results.append(import_source(store, source, kind, opts, clock, on_item=item))
        except KistexpError as exc:
            errors.append(str(exc))
    if progress:
        progress(len(sources), len(sources), "")
    return results, errors
