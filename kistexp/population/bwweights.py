"""Bandwidth weights: the consensus footer's ``bandwidth-weights`` and the authorities' computation.

Classes as clients compute them (population.md §1.4, tor ``node_select.c``): **D** = Guard and a usable
exit (Exit, not BadExit); **G** = Guard, not D; **E** = usable exit, not Guard; **M** = the rest.
A relay's weight for a position is ``W(position, class) * B`` (the V2Dir factors Wgb/Wmb/Web/Wdb are always
the scale in published consensuses, so they are not applied). Guards of class E weigh 0 (hard-coded).

``compute_weights`` is dir-spec §3.8.3 as tor's ``networkstatus_compute_bw_weights_v10`` (dirvote.c) does
it, with C's truncating integer division; a rescaled population must recompute its weights (§1.4).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from kistexp.errors import PopulationError

SCALE = 10000  # bwweightscale default
CLASSES = ("G", "M", "E", "D")
POSITIONS = ("guard", "middle", "exit")
# the footer keys each position reads, by class G, M, E, D; None = hard-coded 0
_KEYS = {
    "guard": ("Wgg", "Wgm", None, "Wgd"),
    "middle": ("Wmg", "Wmm", "Wme", "Wmd"),
    "exit": ("Weg", "Wem", "Wee", "Wed"),
}
REQUIRED = ("Wgg", "Wgd", "Wmg", "Wmm", "Wme", "Wmd", "Wee", "Wed")


@attrs.frozen
class BandwidthWeights:
    """The weights a client uses, as integers over ``scale``."""

    values: tuple[tuple[str, int], ...]
    scale: int = SCALE
    case: str = ""  # the dir-spec case name when computed here

    def get(self, key: str) -> int:
        return dict(self.values)[key]

    def factor(self, position: str, relay_class: str) -> float:
        """W(position, class) / scale."""
        key = _KEYS[position][CLASSES.index(relay_class)]
        if key is None:
            return 0.0
        return dict(self.values)[key] / self.scale

    def table(self) -> dict[str, dict[str, float]]:
        return {p: {c: self.factor(p, c) for c in CLASSES} for p in POSITIONS}


def from_footer(pairs: tuple[tuple[str, int], ...], source: str, scale: int = SCALE) -> BandwidthWeights:
    """The footer's weights; a consensus without them (or missing a key) cannot weight paths."""
    values = dict(pairs)
    if not values:
        raise PopulationError(f"{source}: no bandwidth-weights line in the footer: paths cannot be weighted")
    missing = [k for k in REQUIRED if k not in values]
    if missing:
        raise PopulationError(f"{source}: bandwidth-weights lacks {', '.join(missing)}")
    # published consensuses always carry these equalities (dirvote.c); fill them if an older one omits them
    values.setdefault("Wgm", values["Wgg"])
    values.setdefault("Wem", values["Wee"])
    values.setdefault("Weg", values["Wed"])
    if any(v < 0 for v in values.values()):
        # tor: missing or negative weights make every weight 1 (node_select.c)
        values = {k: scale for k in values}
    return BandwidthWeights(tuple(sorted(values.items())), scale)


def _div(a: int, b: int) -> int:
    """C integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _ok(ws: int, G: int, M: int, E: int, D: int, w: Mapping[str, int], margin: int = 10) -> bool:
    """``networkstatus_check_weights`` with balancing (dirvote.c): sums, range, E/G and middle balance."""
    T = G + M + E + D
    if abs(w["Wed"] + w["Wmd"] + w["Wgd"] - ws) > margin or abs(w["Wmg"] + w["Wgg"] - ws) > margin \
            or abs(w["Wme"] + w["Wee"] - ws) > margin:
        return False
    if any(not 0 <= v <= ws for v in w.values()):
        return False
    guard_side = w["Wgg"] * G + w["Wgd"] * D
    if abs(guard_side - (w["Wee"] * E + w["Wed"] * D)) > margin * T / 3:
        return False
    return abs(guard_side - (M * ws + w["Wmd"] * D + w["Wme"] * E + w["Wmg"] * G)) <= margin * T / 3


def compute_weights(totals: Mapping[str, int], ws: int = SCALE) -> BandwidthWeights:
    """dir-spec §3.8.3 for class bandwidth totals G, M, E, D (kB/s)."""
    G, M, E, D = (int(totals[c]) for c in CLASSES)
    T = G + M + E + D
    if min(G, M, E, D) <= 0:
        raise PopulationError(f"cannot compute bandwidth weights: a class has no bandwidth (G={G} M={M} E={E} D={D})")
    if 3 * E >= T and 3 * G >= T:
        case = "Case 1"
        Wgd = Wed = Wmd = ws // 3
        Wee = _div(ws * (E + G + M), 3 * E)
        Wme = ws - Wee
        Wmg = _div(ws * (2 * G - E - M), 3 * G)
        Wgg = ws - Wmg
    elif 3 * E < T and 3 * G < T:
        R, S = min(E, G), max(E, G)
        if R + D < S:
            Wgg = Wee = ws
            Wmg = Wme = Wmd = 0
            case, Wed, Wgd = ("Case 2a (E scarce)", ws, 0) if E < G else ("Case 2a (G scarce)", 0, ws)
        else:
            case = "Case 2b1"
            Wee = _div(ws * (E - G + M), E)
            Wed = _div(ws * (D - 2 * E + 4 * G - 2 * M), 3 * D)
            Wme = _div(ws * (G - M), E)
            Wmg = 0
            Wgg = ws
            Wmd = Wgd = _div(ws - Wed, 2)
            if not _ok(ws, G, M, E, D, dict(Wgg=Wgg, Wgd=Wgd, Wmg=Wmg, Wme=Wme, Wmd=Wmd, Wee=Wee, Wed=Wed)):
                case = "Case 2b2"
                Wgg = Wee = ws
                Wed = _div(ws * (D - 2 * E + G + M), 3 * D)
                Wmd = _div(ws * (D - 2 * M + G + E), 3 * D)
                Wme = Wmg = 0
                if Wmd < 0:
                    case, Wmd = "Case 2b3", 0
                Wgd = ws - Wed - Wmd
    else:
        S = min(E, G)
        if 3 * (S + D) < T:
            if G < E:
                case = "Case 3a (G scarce)"
                Wgg = Wgd = ws
                Wmd = Wed = Wmg = 0
                Wme = 0 if E < M else _div(ws * (E - M), 2 * E)
                Wee = ws - Wme
            else:
                case = "Case 3a (E scarce)"
                Wee = Wed = ws
                Wmd = Wgd = Wme = 0
                Wmg = 0 if G < M else _div(ws * (G - M), 2 * G)
                Wgg = ws - Wmg
        elif G < E:
            case = "Case 3bg (G scarce)"
            Wgg = ws
            Wgd = _div(ws * (D - 2 * G + E + M), 3 * D)
            Wmg = 0
            Wee = _div(ws * (E + M), 2 * E)
            Wme = ws - Wee
            Wmd = Wed = _div(ws - Wgd, 2)
        else:
            case = "Case 3be (E scarce)"
            Wee = ws
            Wed = _div(ws * (D - 2 * E + G + M), 3 * D)
            Wme = 0
            Wgg = _div(ws * (G + M), 2 * G)
            Wmg = ws - Wgg
            Wmd = Wgd = _div(ws - Wed, 2)
    values = {
        "Wbd": Wmd, "Wbe": Wme, "Wbg": Wmg, "Wbm": ws, "Wdb": ws, "Web": ws, "Wed": Wed, "Wee": Wee,
        "Weg": Wed, "Wem": Wee, "Wgb": ws, "Wgd": Wgd, "Wgg": Wgg, "Wgm": Wgg, "Wmb": ws, "Wmd": Wmd,
        "Wme": Wme, "Wmg": Wmg, "Wmm": ws,
    }
    return BandwidthWeights(tuple(sorted(values.items())), ws, case)
