"""What an Arti client does with the consensus's KIST parameters (Arti, the Rust Tor implementation).

Read in Arti's source (the ``zydou/arti`` mirror of ``tpo/core/arti``, ``main`` of 2026-08-20,
after Arti 2.5.1; KIST first appeared in Arti 1.4.0, CHANGELOG.md):

* ``crates/tor-netdir/src/params.rs``, ``NetParameters``: Arti keeps its own list of consensus
  parameters. Two concern KIST: ``kist_enabled`` from ``"kist-enabled"``, a ``BoundedInt32<0, 1>``
  defaulting to 0 ("0: No KIST. 1: KIST using TCP_NOTSENT_LOWAT"; a TODO there says the default
  becomes 1 once KIST is trusted together with congestion control), and ``kist_tcp_notsent_lowat``
  from ``"kist-tcp-notsent-lowat"``, a ``BoundedInt32<1, i32::MAX>`` defaulting to 1 (the
  TCP_NOTSENT_LOWAT value in bytes while ``kist-enabled`` is 1). Neither ``KISTSchedRunInterval``
  nor ``KISTSchedRunIntervalClient`` is in the list: Arti ignores both.
* Same file, ``set_saturating`` / ``NetParameters::from_map``: a parameter absent from the consensus
  keeps its default; a value inside the type's bounds is taken as it is; a value outside them is
  clamped to the nearer bound (``from_saturating``, i.e. ``BoundedInt32::saturating_new`` in
  ``crates/tor-units/src/lib.rs``: ``clamp(val, LOWER, UPPER)``), with a warning "clamping out of
  range value". Names Arti does not know are ignored.
* ``crates/tor-chanmgr/src/mgr/state.rs``: ``kist_mode_from_net_parameter`` turns 0 into
  ``KistMode::Disabled`` and 1 into ``KistMode::TcpNotSentLowat``; when a new directory brings KIST
  parameters different from the ones held, every open channel is told (``reparameterize_kist``). A
  channel opened later is given only the padding parameters (``upgrade_pending_channel_to_open``),
  so it keeps the kernel's default until the KIST parameters next change.
* ``crates/tor-proto/src/channel/reactor.rs``, ``apply_kist_params``: on Linux, ``TcpNotSentLowat``
  sets the socket option ``TCP_NOTSENT_LOWAT`` to ``kist-tcp-notsent-lowat`` and ``Disabled`` sets it
  to ``u32::MAX`` (4294967295, the kernel's "no limit" default); on other systems it only warns "KIST
  not currently supported on non-linux platforms" (``crates/tor-rtcompat/src/impls/streamops.rs``
  implements the option for Linux only).
* ``crates/tor-proto/src/channel/kist.rs`` and ``reactor.rs``: there is no scheduler run and no
  timer. The channel reactor writes cells to the TLS sink whenever the sink is ready; KIST in Arti
  is only the kernel-side limit on unsent bytes. So no run interval exists to configure.
* ``params.rs`` also reads ``CircuitPriorityHalflifeMsec`` into ``circuit_priority_half_life``, but
  nothing outside that file uses the value: Arti has no EWMA circuit priority.

kistexp's catalogue (``kistexp.params``) holds the two parameters' defaults and bounds; this module
holds the rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from kistexp import params as catalogue
from kistexp.errors import PopulationError

KIST_ENABLED = "kist-enabled"
KIST_TCP_NOTSENT_LOWAT = "kist-tcp-notsent-lowat"
KIST_PARAMS = (KIST_ENABLED, KIST_TCP_NOTSENT_LOWAT)
#: what Arti sets TCP_NOTSENT_LOWAT to while KIST is off (u32::MAX, the Linux default)
LOWAT_UNLIMITED = 2**32 - 1

#: consensus parameters of kistexp's catalogue that Arti's ``NetParameters`` reads and uses
#: (``crates/tor-netdir/src/params.rs``; Arti reads others too, guard-*, hs*, nf_ito_*,
#: vanguards-*, that kistexp does not catalogue). Not among them: KISTSchedRunInterval,
#: KISTSchedRunIntervalClient, CircuitPriorityTickSecs, orconn_*, cellq_*, circ_max_cell_queue_size*,
#: perconnbw*, cfx_*, cc_vegas_*_sbws, cc_sscap_sbws, UseOptimisticData and the authorities' own.
ARTI_READS = frozenset({
    *KIST_PARAMS,
    "bwweightscale", "circwindow", "ExtendByEd25519ID", "sendme_accept_min_version", "sendme_emit_min_version",
    "cbtdisabled", "cbtnummodes", "cbtrecentcount", "cbtmaxtimeouts", "cbtmincircs", "cbtquantile",
    "cbtclosequantile", "cbtmintimeout", "cbtinitialtimeout", "cbttestfreq", "cbtmaxopencircs", "cbtlearntimeout",
    "cc_alg", "cc_cwnd_full_gap", "cc_cwnd_full_minpct", "cc_cwnd_full_per_cwnd", "cc_cwnd_init",
    "cc_cwnd_inc_pct_ss", "cc_cwnd_inc", "cc_cwnd_inc_rate", "cc_cwnd_min", "cc_cwnd_max", "cc_ewma_cwnd_pct",
    "cc_ewma_max", "cc_ewma_ss", "cc_rtt_reset_pct", "cc_sendme_inc", "cc_ss_max",
    "cc_vegas_alpha_exit", "cc_vegas_beta_exit", "cc_vegas_delta_exit", "cc_vegas_gamma_exit",
    "cc_vegas_alpha_onion", "cc_vegas_beta_onion", "cc_vegas_delta_onion", "cc_vegas_gamma_onion",
    "cc_sscap_exit", "cc_sscap_onion", "cc_xoff_client", "cc_xoff_exit", "cc_xon_rate", "cc_xon_change_pct",
    "cc_xon_ewma_cnt",
})
#: read into NetParameters but used nowhere else in Arti (no EWMA circuit priority)
ARTI_PARSES_UNUSED = frozenset({"CircuitPriorityHalflifeMsec"})


def acts_on(name: str) -> bool:
    """Whether an Arti client changes anything when the consensus sets ``name``."""
    return name in ARTI_READS


def ignores(names: Iterable[str]) -> tuple[str, ...]:
    """The names of ``names`` an Arti client takes no notice of, in their order."""
    return tuple(n for n in names if not acts_on(n))


@attrs.frozen
class ArtiValue:
    """One parameter as an Arti client holds it."""

    name: str
    consensus_value: int | None  # None: absent from the consensus
    value: int  # what Arti runs with
    clamped: bool  # outside Arti's bounds, clamped to the nearer one


def arti_value(name: str, consensus_value: int | None) -> ArtiValue:
    """``name``'s value in Arti's ``NetParameters`` for a consensus value (None: absent): the default when
    absent, the value when inside Arti's bounds, else the nearer bound."""
    if name not in KIST_PARAMS:
        raise PopulationError(f"{name}: not one of Arti's KIST parameters ({', '.join(KIST_PARAMS)})")
    bounds = catalogue.get(name).current  # type: ignore[union-attr]
    if consensus_value is None:
        return ArtiValue(name, None, bounds.default, False)
    if isinstance(consensus_value, bool) or not isinstance(consensus_value, int):
        raise PopulationError(f"{name}={consensus_value!r}: consensus values are integers")
    if not catalogue.INT32_MIN <= consensus_value <= catalogue.INT32_MAX:
        raise PopulationError(f"{name}={consensus_value}: out of range (consensus values are 32-bit signed integers)")
    value = bounds.clamp(consensus_value)
    return ArtiValue(name, consensus_value, value, value != consensus_value)


@attrs.frozen
class ArtiKist:
    """What an Arti client's channels do under a consensus: KIST on or off and the socket's low-water mark."""

    enabled: bool
    tcp_notsent_lowat: int  # Arti's kist_tcp_notsent_lowat (bytes), held even while KIST is off
    clamped: tuple[str, ...]  # parameters Arti clamped to its bounds

    def socket_notsent_lowat(self, linux: bool = True) -> int | None:
        """TCP_NOTSENT_LOWAT on each channel's socket (bytes); None where Arti sets no option (not Linux)."""
        if not linux:
            return None
        return self.tcp_notsent_lowat if self.enabled else LOWAT_UNLIMITED

    @property
    def run_interval_ms(self) -> None:
        """Arti runs no cell scheduler: cells go to the socket as soon as it takes them."""
        return None


def arti_kist(values: Mapping[str, int]) -> ArtiKist:
    """An Arti client's KIST under the consensus parameters ``values`` (every other name is ignored)."""
    enabled = arti_value(KIST_ENABLED, values.get(KIST_ENABLED))
    lowat = arti_value(KIST_TCP_NOTSENT_LOWAT, values.get(KIST_TCP_NOTSENT_LOWAT))
    return ArtiKist(enabled.value == 1, lowat.value, tuple(v.name for v in (enabled, lowat) if v.clamped))


#: the simulator knob that Arti's kist-enabled=1 would need (kistexp.sim has none yet)
MISSING_SIM_KNOB = ("a per-socket TCP_NOTSENT_LOWAT (send-queue bytes not yet sent above which the socket is "
                    "not writable), settable on a node's sockets at run time")


def check_simulable(values: Mapping[str, int]) -> ArtiKist:
    """Arti's KIST under ``values`` if the simulator can run it; with KIST on it cannot (it models no
    TCP_NOTSENT_LOWAT), which is an error rather than a silent run with KIST off."""
    kist = arti_kist(values)
    if kist.enabled:
        raise PopulationError(f"{KIST_ENABLED}=1 turns on Arti's KIST (TCP_NOTSENT_LOWAT={kist.tcp_notsent_lowat} "
                              f"on every channel), which the simulator cannot run: it lacks {MISSING_SIM_KNOB}")
    return kist
