"""The authorities' health as ``kistexp status``, ``history``, ``rollback --dry-run`` and the report
tell it: each round, the stretches without a majority-signed consensus, each authority's outages."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import attrs

from kistexp import jsonout
from kistexp.rollout.journal import (
    CONSENSUS_MISSING,
    CONSENSUS_SIGNED,
    CONSENSUS_UNCHECKED,
    AuthorityOutage,
    ConsensusOutage,
    JournalReader,
    RoundHealth,
    authority_outages,
    consensus_outages,
)
from kistexp.rollout.spec import RolloutSpec
from kistexp.rollout.watch.feed import FeedContext


@jsonout.shape(omit=("rounds", "fmt"), rename={"outages": "consensus_outages"},
               derived={"last_round": lambda h: h.last, "down_since": lambda h: h.down_since()},
               order=("last_round", "down_since"))
@attrs.frozen
class HealthSummary:
    """Each round's authority health, the stretches without a majority-signed consensus and each
    authority's outages, as the journal holds them."""

    rounds: tuple[RoundHealth, ...] = ()  # oldest first
    outages: tuple[ConsensusOutage, ...] = ()
    authority_outages: tuple[AuthorityOutage, ...] = ()
    fmt: str = "%Y-%m-%d %H:%M"

    @property
    def last(self) -> RoundHealth | None:
        return self.rounds[-1] if self.rounds else None

    @property
    def current_outage(self) -> ConsensusOutage | None:
        return self.outages[-1] if self.outages and self.outages[-1].ongoing else None

    def down_since(self) -> dict[str, dt.datetime]:
        return {o.authority: o.start for o in self.authority_outages if o.ongoing}

    def last_round_text(self) -> str:
        """The newest round in one line: who voted, who was down (since when), the consensus."""
        r = self.last
        if r is None:
            return "authorities: no round checked yet"
        since = self.down_since()
        parts = [f"round of {r.valid_after:{self.fmt}}"]
        if r.votes_checked:
            parts.append(f"{len(r.voted)} of {r.n_authorities} voted")
            if r.down:
                parts.append("no vote from " + ", ".join(
                    f"{a} (down since {since[a]:{self.fmt}})" if a in since and since[a] != r.valid_after else a
                    for a in r.down))
            if r.stale:
                parts.append(f"old votes from {', '.join(r.stale)}")
        else:
            parts.append("who voted is not known")
        words = {CONSENSUS_SIGNED: f"consensus signed by {len(r.signed) or '?'} of {r.n_authorities}",
                 CONSENSUS_MISSING: "no consensus published",
                 CONSENSUS_UNCHECKED: "consensus not checked"}
        parts.append(words.get(r.consensus, f"consensus signed by only {len(r.signed)} of {r.n_authorities}"))
        return "authorities, " + "; ".join(parts)


def health_of(reader: JournalReader, spec: RolloutSpec | None) -> HealthSummary:
    authorities = tuple(spec.authorities) if spec is not None else ()
    rounds = reader.round_health(authorities)
    interval = spec.hour if spec is not None else None
    fmt = FeedContext("", spec).fmt
    return HealthSummary(rounds, consensus_outages(rounds, interval), authority_outages(rounds, interval), fmt)


def health_summary(exp_path: Path | str, spec: RolloutSpec | None = None) -> HealthSummary:
    """The authority health of the experiment at ``exp_path``, read-only (beside a live run too)."""
    from kistexp.rollout.runs import load_spec

    if spec is None:
        spec = load_spec(Path(exp_path))[0]
    with JournalReader.of_experiment(exp_path) as reader:
        return health_of(reader, spec)
