"""kistexp: plan, rehearse, run and roll back Tor consensus-parameter experiments."""

__version__ = "0.1.0"
