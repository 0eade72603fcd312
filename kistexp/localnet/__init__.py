"""A private tor network on loopback (real-tor.md): spec, processes, documents, traffic."""

from kistexp.localnet.network import DirDocument, LocalNetwork, have_tor, require_tor
from kistexp.localnet.spec import NetworkSpec, parse_params_arg, scheduler_options

__all__ = [
    "DirDocument",
    "LocalNetwork",
    "NetworkSpec",
    "have_tor",
    "parse_params_arg",
    "require_tor",
    "scheduler_options",
]
