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
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs

from kistexp.clock import RealClock
from kistexp.errors import KistexpError
from kistexp.metrics.collectors import Collected, group_samples, read_head
from kistexp.metrics.series import Sample
from kistexp.metrics.store import MetricStore

KINDS = ("onionperf", "operator-report", "consensus-archive", "metricsport", "prometheus", "proc")
# Live sources: scrapes and the seconds between them. A day of one-minute scrapes fits; NaN, an
# infinite or a negative interval once ended in a traceback, a huge one in a wait without end.
MAX_SCRAPES = 10_000
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.1, 3600.0
# tor's consensus parameters are int32 (a larger value cannot be in a consensus, and one beyond
# 64 bits made the store fail with an OverflowError)
PARAM_MIN, PARAM_MAX = -(2**31), 2**31 - 1
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_]{0,63}")


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

    def check(self) -> None:
        """Refuse, in one line naming the option, what no source can be imported with."""
        if not (isinstance(self.interval_s, (int, float)) and math.isfinite(self.interval_s)
                and MIN_INTERVAL_S <= self.interval_s <= MAX_INTERVAL_S):
            raise SourceKindError(f"--interval {self.interval_s!r}: seconds between scrapes must be a number from "
                                  f"{MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g}")
        if self.scrapes > MAX_SCRAPES:
            raise SourceKindError(f"--scrapes {self.scrapes}: at most {MAX_SCRAPES} scrapes")
        if self.param_value is not None and not PARAM_MIN <= self.param_value <= PARAM_MAX:
            raise SourceKindError(f"--param-value {self.param_value}: a consensus parameter is a 32-bit integer "
                                  f"({PARAM_MIN} to {PARAM_MAX})")
        for key in self.labels:
            if not _LABEL_KEY.fullmatch(key):
                raise SourceKindError(f"--label {key!r}: a label name is a lowercase letter, then at most 63 "
                                      "lowercase letters, digits or '_'")


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
    # a FIFO would block this read for ever, /dev/zero answer zeros without end
    head = read_head(path, 256, "a metric source", SourceKindError)
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
    problems: list[str] = []
    for i in range(opts.scrapes):
        if i:
            clock.sleep_until(clock.now() + dt.timedelta(seconds=opts.interval_s))
        pairs.extend(poller.poll())
        # what a scrape left out (a NaN, a series given twice) is said, not lost: its metric may be missing
        last = getattr(getattr(poller, "poller", None), "last", None)
        problems.extend(p for p in (last.problems if last is not None else ()) if p not in problems)
    return Collected(kind, source, group_samples(pairs), tuple(problems))


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
    opts.check()
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
    opts.check()  # a bad option is one error for the command, not one per source
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
