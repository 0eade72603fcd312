"""The v3 directory authorities of the live Tor network (dirspec-params.md §7).

Stem's and older tor's tables are stale (old tor26, no faravahar); this is today's nine.
"""

from __future__ import annotations

import attrs


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


def by_nickname(nickname: str) -> DirectoryAuthority | None:
    for auth in DEFAULT_AUTHORITIES:
        if auth.nickname.lower() == nickname.lower():
            return auth
    return None
