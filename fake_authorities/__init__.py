"""Fake v3 directory authorities on loopback, speaking tor's DirPort protocol.

``python -m fake_authorities --count 9 --port 7000 --interval 10s`` (or ``kistexp authorities
serve``) runs them; tests and tools use ``FakeAuthorityNetwork`` in-process. See
docs/fake-authorities.md.
"""

from fake_authorities.faults import FAULT_KINDS, Fault
from fake_authorities.network import FakeAuthorityNetwork, NetworkError

__all__ = ["FAULT_KINDS", "FakeAuthorityNetwork", "Fault", "NetworkError"]
