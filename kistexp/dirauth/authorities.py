"""The v3 directory authorities of the live Tor network (dirspec-params.md §7).

Stem's and older tor's tables are stale (old tor26, no faravahar); this is today's nine, as
tor's ``src/app/config/auth_dirs.inc`` (main) pins them. A signature counts only when its
identity is one of the configured authorities' v3idents, as tor trusts only its
DirAuthority lines: a certificate file or a server can never add an identity.

``AUTHORITY_SETS`` also names an earlier pinned set, for checking archived documents.
"""

from __future__ import annotations

import re

import attrs

from kistexp.errors import DirectoryError

#: A tor nickname (1-19 letters or digits); fullmatch, so a trailing newline is refused.
NICKNAME_RE = re.compile(r"[A-Za-z0-9]{1,19}")
#: A v3ident: the upper- or lower-case hex SHA-1 of an authority identity key.
V3IDENT_RE = re.compile(r"[0-9A-Fa-f]{40}")


def parse_nickname(text: str, where: str) -> str:
    if not NICKNAME_RE.fullmatch(text):
        raise DirectoryError(f"{where}: {text!r} is not a tor nickname (1-19 letters or digits)")
    return text


def parse_v3ident(text: str, where: str) -> str:
    """The v3ident in upper case; DirectoryError unless exactly 40 hex digits."""
    if not V3IDENT_RE.fullmatch(text):
        raise DirectoryError(f"{where}: {text!r} is not a v3ident (40 hex digits, the SHA-1 of the "
                                   "authority identity key, as in a DirAuthority line)")
    return text.upper()


@attrs.frozen
class DirectoryAuthority:
    """One v3 directory authority as a DirAuthority line names it."""

    nickname: str
    v3ident: str  # hex SHA-1 of the authority identity key (the "fingerprint" in its key cert)
    address: str
    dirport: int
    orport: int
    fingerprint: str = ""  # relay identity fingerprint, when known
    ipv6: str = ""

    @property
    def dir_url(self) -> str:
        return f"http://{self.address}:{self.dirport}"


DEFAULT_AUTHORITIES: tuple[DirectoryAuthority, ...] = (
    DirectoryAuthority("moria1", "F533C81CEF0BC0267857C99B2F471ADF249FA232", "128.31.0.39", 9231, 9201,
                       "1A25C6358DB91342AA51720A5038B72742732498"),
    DirectoryAuthority("tor26", "2F3DF9CA0E5D36F2685A2DA67184EB8DCB8CBA8C", "217.196.147.77", 80, 443,
                       "FAA4BCA4A6AC0FB4CA2F8AD5A11D9E122BA894F6", "2a02:16a8:662:2203::1"),
    DirectoryAuthority("dizum", "E8A9C45EDE6D711294FADF8E7951F4DE6CA56B58", "45.66.35.11", 80, 443,
                       "7EA6EAD6FD83083C538F44038BBFA077587DD755", "2a09:61c0::1337"),
    DirectoryAuthority("gabelmoo", "ED03BB616EB2F60BEC80151114BB25CEF515B226", "131.188.40.189", 80, 443,
                       "F2044413DAC2E02E3D6BCF4735A19BCA1DE97281", "2001:638:a000:4140::ffff:189"),
    DirectoryAuthority("dannenberg", "0232AF901C31A04EE9848595AF9BB7620D4C5B2E", "193.23.244.244", 80, 443,
                       "7BE683E65D48141321C5ED92F075C55364AC7123", "2001:678:558:1000::244"),
    DirectoryAuthority("maatuska", "49015F787433103580E3B66A1707A00E60F2D15B", "171.25.193.9", 443, 80,
                       "BD6A829255CB08E66FBE7D3748363586E46B3810", "2001:67c:289c::9"),
    DirectoryAuthority("longclaw", "23D15D965BC35114467363C165C4F724B64B4F66", "199.58.81.140", 80, 443,
                       "74A910646BCEEFBCD2E874FC1DC997430F968145"),
    DirectoryAuthority("bastet", "27102BC123E7AF1D4741AE047E160C91ADC76B21", "204.13.164.118", 80, 443,
                       "24E2F139121D4394C54B5BCC368B3B411857C413", "2620:13:4000:6000::1000:118"),
    DirectoryAuthority("faravahar", "70849B868D606BAECFB6128C5E3D782029AA394F", "216.218.219.41", 80, 443,
                       "E3E42D35F801C9D5AB23584E0025D56FE2B33396", "2001:470:164:2::2"),
)


#: tor 0.4.7.10's auth_dirs.inc (August 2022): the nine authorities that signed consensuses
#: until moria1's identity rotated (tor commit 72b04a5aa4, 2022-11-29). tor26 and Faravahar
#: rotated later; their old identities are not trusted by default.
AUTHORITIES_TOR_0_4_7_10: tuple[DirectoryAuthority, ...] = (
    DirectoryAuthority("moria1", "D586D18309DED4CD6D57C18FDB97EFA96D330566", "128.31.0.39", 9131, 9101,
                       "9695DFC35FFEB861329B9F1AB04C46397020CE31"),
    DirectoryAuthority("tor26", "14C131DFC5C6F93646BE72FA1401C02A8DF2E8B4", "86.59.21.38", 80, 443,
                       "847B1F850344D7876491A54892F904934E4EB85D"),
    DirectoryAuthority("dizum", "E8A9C45EDE6D711294FADF8E7951F4DE6CA56B58", "45.66.33.45", 80, 443,
                       "7EA6EAD6FD83083C538F44038BBFA077587DD755"),
    DirectoryAuthority("gabelmoo", "ED03BB616EB2F60BEC80151114BB25CEF515B226", "131.188.40.189", 80, 443,
                       "F2044413DAC2E02E3D6BCF4735A19BCA1DE97281"),
    DirectoryAuthority("dannenberg", "0232AF901C31A04EE9848595AF9BB7620D4C5B2E", "193.23.244.244", 80, 443,
                       "7BE683E65D48141321C5ED92F075C55364AC7123"),
    DirectoryAuthority("maatuska", "49015F787433103580E3B66A1707A00E60F2D15B", "171.25.193.9", 443, 80,
                       "BD6A829255CB08E66FBE7D3748363586E46B3810"),
    DirectoryAuthority("Faravahar", "EFCBE720AB3A82B99F9E953CD5BF50F7EEFC7B97", "154.35.175.225", 80, 443,
                       "CF6D0AAFB385BE71B8E111FC5CFF4B47923733BC"),
    DirectoryAuthority("longclaw", "23D15D965BC35114467363C165C4F724B64B4F66", "199.58.81.140", 80, 443,
                       "74A910646BCEEFBCD2E874FC1DC997430F968145"),
    DirectoryAuthority("bastet", "27102BC123E7AF1D4741AE047E160C91ADC76B21", "204.13.164.118", 80, 443,
                       "24E2F139121D4394C54B5BCC368B3B411857C413"),
)

#: Pinned sets by name: ``current`` (the default) and the one archived 2022 documents need.
AUTHORITY_SETS: dict[str, tuple[DirectoryAuthority, ...]] = {
    "current": DEFAULT_AUTHORITIES,
    "tor-0.4.7.10": AUTHORITIES_TOR_0_4_7_10,
}


def authority_set(name: str) -> tuple[DirectoryAuthority, ...]:
    try:
        return AUTHORITY_SETS[name.lower()]
    except KeyError:
        raise DirectoryError(f"--authority-set {name!r}: unknown (known: {', '.join(AUTHORITY_SETS)})") from None


def parse_trusted(spec: str) -> tuple[str, str]:
    """``NICK=V3IDENT`` as given to ``--v3ident``: (nickname, upper-case v3ident)."""
    nick, sep, ident = spec.partition("=")
    if not sep:
        raise DirectoryError(f"--v3ident {spec!r}: expected NICK=V3IDENT (40 hex digits)")
    return parse_nickname(nick, f"--v3ident {spec!r}"), parse_v3ident(ident, f"--v3ident {spec!r}")


def by_nickname(nickname: str) -> DirectoryAuthority | None:
    for auth in DEFAULT_AUTHORITIES:
        if auth.nickname.lower() == nickname.lower():
            return auth
    return None
