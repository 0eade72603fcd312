"""What an attacker gains at each stage of a plan: the stored attack measures of ``kistexp simulate``
(``kistexp.metrics.series.AttackValue``, one per stage, measure and sampled network) turned into
paired differences, stage minus baseline, over the sampled networks (``paired.paired_difference``:
the baseline and every stage run on the same networks, clients and traffic, so each network is one
unit). The figures the plan report, the experiment report and an anonymity criterion read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from kistexp.anonymity.paired import PairedDifference, paired_difference
from kistexp.metrics import catalogue
from kistexp.metrics.series import AttackValue

BASELINE = "baseline"


@attrs.frozen
class AttackFigure:
    """One measure of one stage against the baseline, over the networks both were measured on."""

    stage: str
    difference: PairedDifference

    @property
    def measure(self) -> str:
        return self.difference.measure

    @property
    def leakier(self) -> bool:
        """The interval lies wholly on the side where the attack does better."""
        m = catalogue.attack_measure(self.measure)
        way = m.leakier if m is not None else +1
        d = self.difference
        return d.low > 0 if way > 0 else d.high < 0


def stage_differences(values: Iterable[AttackValue], stages: Sequence[str] | None = None,
                      confidence: float = 0.95) -> list[AttackFigure]:
    """Per stage (``stages``' order; default: every stored one but the baseline) and measure (catalogue
    order, uncatalogued TPRs last), the paired difference stage minus baseline over the networks both
    have; a stage or measure the baseline lacks gives none."""
    by: dict[tuple[str, str], dict[int, float]] = {}
    for v in values:
        by.setdefault((v.stage, v.measure), {})[v.network] = v.value
    if stages is None:
        stages = list(dict.fromkeys(s for s, _ in by if s != BASELINE))
    order = {m: i for i, m in enumerate(catalogue.attack_measure_names())}
    measures = sorted({m for _, m in by}, key=lambda m: (order.get(m, len(order)), m))
    out = []
    for stage in stages:
        if stage == BASELINE:
            continue
        for m in measures:
            base, run = by.get((BASELINE, m)), by.get((stage, m))
            if not base or not run:
                continue
            nets = sorted(set(base) & set(run))
            out.append(AttackFigure(stage, paired_difference(m, [base[n] for n in nets], [run[n] for n in nets],
                                                             confidence)))
    return out
