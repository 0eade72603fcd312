"""One FAIL error across a stage's criteria (spec judge.md §5.5; docs/judge.md "Several criteria").

Any FAIL rolls back, so the stage's family of criteria shares one FAIL error α (5 %). The
plan chooses how (``[experiment] correction``):

* ``holm`` (default): Holm's step-down (Holm, Scand. J. Statist. 6, 1979), weighted by each
  criterion's share of α. Every criterion starts at its Bonferroni share; when some FAIL, their
  shares go to the others, which are judged again at the larger level, until no new FAIL. With
  sequential looks the recycled share re-levels the criterion's whole spending sequence
  (Maurer & Bretz, Stat. Biopharm. Res. 5, 2013: graphical Holm in group-sequential trials),
  which ``SequentialState`` supports by keeping the fractions and taking the level per look.
* ``bonferroni``: each criterion at its share, never recycled.
* ``none``: each criterion at the whole α (up to 1 − 0.95⁵ = 23 % family false FAIL for five;
  spec §5.5 allows it only when the plan says so).

GrowthBook notes that Holm cannot adjust intervals directly. The judge shows each criterion's
interval at the level Holm judged it at: a criterion that FAILed at step k shows the lower bound
that cleared the limit at that step's level; every criterion that did not FAIL shows its interval
at the level of the first step it was not rejected at, the level of the last step (Strassburger &
Bretz, Stat. Med. 27, 2008: compatible bounds for Holm). Their p-values are above that level, so
no shown interval excludes the limit without its FAIL, and none includes it with one.

PASS needs every criterion to PASS (an intersection-union test, Berger 1982): its error is not
split (spec §5.5).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TypeVar

import attrs

from kistexp.judge.model import Verdict
from kistexp.plan.model import CORRECTIONS, DEFAULT_CORRECTION

T = TypeVar("T")
__all__ = ["CORRECTIONS", "DEFAULT_CORRECTION", "TRIPWIRE_ALPHA", "annotate", "fail_alphas", "step_down"]
TRIPWIRE_ALPHA = 0.001  # spec §5.2 and §7: a critical criterion's own FAIL error
_MAX_LEVEL = 0.49  # the judge takes error rates below 0.5 (kistexp.judge.model.check_alpha)


def fail_alphas(criteria, alpha: float, correction: str = DEFAULT_CORRECTION,
                shared: Sequence[bool] | None = None) -> list[float]:
    """Each criterion's first-step FAIL error: tripwires (critical = true) take 0.001 each; the rest
    of α is split evenly over the other criteria (Bonferroni, spec §5.5), or each gets the whole α
    with ``correction = "none"``. Dry-run criteria (``dry_run``, or False in ``shared``) never act,
    so they spend none of the budget and are judged at α. Holm starts from these shares (the most
    conservative level a criterion is ever judged at, the one the linter forecasts)."""
    if correction not in CORRECTIONS:
        raise ValueError(f"correction {correction!r} is not one of {', '.join(CORRECTIONS)}")
    acts = list(shared) if shared is not None else [not getattr(c, "dry_run", False) for c in criteria]
    trips = sum(1 for c, a in zip(criteria, acts, strict=True) if a and getattr(c, "critical", False))
    rest = max(alpha - TRIPWIRE_ALPHA * trips, TRIPWIRE_ALPHA)
    others = max(1, sum(acts) - trips)
    out = []
    for c, acting in zip(criteria, acts, strict=True):
        if acting and getattr(c, "critical", False):
            out.append(TRIPWIRE_ALPHA)
        elif not acting or correction == "none":
            out.append(alpha)
        else:
            out.append(rest / others)
    return out


def step_down(judges: Sequence[Callable[[float, str], T] | None], shares: Sequence[float], correction: str,
              is_fail: Callable[[T], bool], *, failed: Collection[int] = (),
              shared: Sequence[bool] | None = None) -> list[T | None]:
    """Judge a family of criteria at one look with the plan's correction.

    ``judges[i](level, label)`` judges criterion i at FAIL error ``level`` (``label`` says how it
    was reached: "holm 2/5", "bonferroni", "none") and returns its verdict; None for a criterion not
    judged at this look (decided at an earlier one, or without data). ``shares`` are the
    ``fail_alphas``; ``failed`` the criteria that FAILed at earlier looks, whose shares the others
    inherit under Holm; ``shared`` marks the criteria in the family (default: all; dry-run ones are
    not). Returns each criterion's verdict (None where not judged).
    """
    m = len(shares)
    in_family = list(shared) if shared is not None else [True] * m
    family = [i for i in range(m) if in_family[i]]
    out: list[T | None] = [None] * m
    if correction not in CORRECTIONS:
        raise ValueError(f"correction {correction!r} is not one of {', '.join(CORRECTIONS)}")
    if correction != "holm":
        for i, judge in enumerate(judges):
            if judge is not None:
                out[i] = judge(shares[i], correction if in_family[i] else "none")
        return out
    for i in range(m):
        if not in_family[i] and judges[i] is not None:
            out[i] = judges[i](shares[i], "none")  # a dry-run criterion spends nothing
    budget = sum(shares[i] for i in family)
    rejected = {i for i in failed if in_family[i]}
    levels: dict[int, float] = {}
    while True:
        open_ = [i for i in family if i not in rejected]
        if not open_:
            break
        left = sum(shares[i] for i in open_)
        step = len(family) - len(open_) + 1
        newly = []
        for i in open_:
            judge = judges[i]
            if judge is None:
                continue
            level = min(shares[i] * budget / left, _MAX_LEVEL) if left > 0 else shares[i]
            if levels.get(i) == level:
                continue
            levels[i] = level
            out[i] = judge(level, f"holm {step}/{len(family)}")
            if is_fail(out[i]):
                newly.append(i)
        if not newly:
            break
        rejected.update(newly)
    return out


def annotate(v: Verdict, label: str) -> Verdict:
    """``v`` with the correction it was judged under, in its field and its detail."""
    if not label:
        return v
    return attrs.evolve(v, correction=label, detail=f"{v.detail}; FAIL error {v.alpha_fail:.4g} ({label})")
