"""Networks for the attack measures: the leaky control.

``isolate_circuits(net)`` is the spec's deliberately leaky configuration (anonymity.md, "Statistics"):
one circuit per channel and no other traffic on the relays.  It keeps the network's nodes, circuits
(same ids, same labels), transfers and interactive flows, and gives each circuit private copies of its
relays (same configuration: scheduler, interval, tick, NIC rate, tor version) joined by channels with the
same links (same RTT, loss).  The clients, their regions, the paths' latencies and the traffic are those
of the original, so the control pairs with it unit by unit (common random numbers); only the sharing of
relays and channels is gone.  The original relays stay in the network, carrying nothing (probes may be
put on the copies: ``relay_copies``).  Interval changes of the description are not carried over (they
name the original relays); hand new values to a run with ``Simulation.apply``.
"""

from __future__ import annotations

import attrs

from kistexp.sim import Network


@attrs.frozen
class Isolated:
    network: Network
    #: per circuit id, the node ids of its path in the isolated network (client first)
    paths: tuple[tuple[int, ...], ...]

    def relay_copies(self, circuit: int) -> tuple[int, ...]:
        """The private relays of ``circuit`` (guard first)."""
        return self.paths[circuit][1:]


def isolate_circuits(net: Network) -> Isolated:
    """The leaky control of ``net`` (see the module docstring)."""
    out = Network(net.default_link)
    for cfg, name in zip(net.nodes, net.node_names, strict=True):
        out.add_node(cfg, name)
    paths = []
    for j, (path, label) in enumerate(net.circuits):
        new = [path[0]]
        for k, r in enumerate(path[1:], start=1):
            new.append(out.add_node(net.nodes[r], f"{net.node_names[r]}@c{j}h{k}"))
        for k in range(len(path) - 1):
            out.add_channel(new[k], new[k + 1], net.channels[net.channel_between(path[k], path[k + 1])][2])
        if out.add_circuit(new, label) != j:
            raise AssertionError("circuit ids must be kept")
        paths.append(tuple(new))
    for part in net.transfer_parts():
        if isinstance(part, tuple):
            out.add_transfers(*part)
        else:
            out.add_interactive(part)
    return Isolated(out, tuple(paths))
