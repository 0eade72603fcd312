"""Experiment plans: the TOML format as frozen attrs classes, loading, lint and timeline."""

from kistexp.plan.loader import load_plan, parse_plan
from kistexp.plan.model import Plan, Stage

__all__ = ["Plan", "Stage", "load_plan", "parse_plan"]
