"""Consensus archives: parameter history, votes per authority, signatures checked."""

from __future__ import annotations

import datetime as dt
import io
import tarfile

import pytest

from kistexp.dirauth.documents import (
    AuthorityIdentity,
    AuthorityKeys,
    RouterStatus,
    StatusHeader,
    dir_source_for_vote,
    load_key_certificates,
    parse_key_certificates,
    parse_network_status,
    render_consensus,
    render_vote,
)
from kistexp.errors import DocumentError
from kistexp.expdir import ExperimentDir
from kistexp.metrics.collectors import consensus_archive as ca
from kistexp.metrics.store import MetricStore

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, 10, tzinfo=UTC)
# The nine authorities of tor 0.4.7.10's auth_dirs.inc, who signed the 2022 consensus
# (moria1 and tor26 have rotated their identities since, so today's nine verify only 5).
PINNED_2022 = ("D586D18309DED4CD6D57C18FDB97EFA96D330566", "14C131DFC5C6F93646BE72FA1401C02A8DF2E8B4",
               "E8A9C45EDE6D711294FADF8E7951F4DE6CA56B58", "ED03BB616EB2F60BEC80151114BB25CEF515B226",
               "0232AF901C31A04EE9848595AF9BB7620D4C5B2E", "49015F787433103580E3B66A1707A00E60F2D15B",
               "EFCBE720AB3A82B99F9E953CD5BF50F7EEFC7B97", "23D15D965BC35114467363C165C4F724B64B4F66",
               "27102BC123E7AF1D4741AE047E160C91ADC76B21")


@pytest.fixture(scope="module")
def real_certs(certs_path):
    return load_key_certificates(certs_path)


def test_real_consensus_and_microdesc(consensus_path, microdesc_consensus_path, real_certs):
    got = ca.read_archive(consensus_path, certificates=real_certs, trusted=PINNED_2022)
    (c,) = got.consensuses
    assert got.problems == ()
    assert c.valid_after == dt.datetime(2022, 11, 19, 10, tzinfo=UTC) and c.flavour == "ns"
    assert c.n_relays == 6088 and c.n_signatures == 8 and c.n_valid == 8 and c.verified
    assert len(c.params) == 33
    assert c.params["KISTSchedRunInterval"] == 2 and c.params["CircuitPriorityHalflifeMsec"] == 30000
    assert c.params["cc_alg"] == 2 and c.params["circ_max_cell_queue_size"] == 2000
    (m,) = ca.read_archive(microdesc_consensus_path, certificates=real_certs, trusted=PINNED_2022).consensuses
    assert m.flavour == "microdesc" and m.n_relays == 6088 and m.params == c.params


def test_real_consensus_in_a_collector_tarball_with_annotation(tmp_path, consensus_path, certs_path):
    tar_path = tmp_path / "consensuses-2022-11.tar"
    with tarfile.open(tar_path, "w") as tar:
        data = b"@type network-status-consensus-3 1.0\n" + consensus_path.read_bytes()
        info = tarfile.TarInfo("consensuses-2022-11/19/2022-11-19-10-00-00-consensus")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        evil = tarfile.TarInfo("../escape")
        evil.size = 1
        tar.addfile(evil, io.BytesIO(b"x"))
        link = tarfile.TarInfo("consensuses-2022-11/link")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tar.addfile(link)
        certs = certs_path.read_bytes()
        cinfo = tarfile.TarInfo("certs/cached-certs")
        cinfo.size = len(certs)
        tar.addfile(cinfo, io.BytesIO(certs))
    got = ca.read_archive(tar_path, trusted=PINNED_2022)  # the certificates in the tarball are enough
    (c,) = got.consensuses
    assert c.params["KISTSchedRunInterval"] == 2 and c.n_valid == 8
    assert c.location.endswith(":consensuses-2022-11/19/2022-11-19-10-00-00-consensus")
    assert any("leaves the archive" in p for p in got.problems)
    assert any("links and special files" in p for p in got.problems)
    # the consensus waits for the certificates at the end of the tarball, within a bound
    with pytest.raises(ca.ArchiveError, match="1 consensuses and no authority key certificate yet"):
        ca.read_archive(tar_path, trusted=PINNED_2022, limits=ca.Limits(max_pending=1_000_000))


def test_newer_annotation_and_no_certificates(tmp_path, consensus_path):
    f = tmp_path / "2022-11-19-10-00-00-consensus"
    f.write_bytes(b"@type network-status-consensus-3 2.0\n" + consensus_path.read_bytes()[:5000])
    got = ca.read_archive(f)
    assert got.consensuses == () and "is newer than this kistexp reads" in got.problems[0]
    with pytest.raises(ca.ArchiveError, match="no authority key certificates"):
        ca.read_archive(consensus_path)


def test_only_pinned_identities_count(consensus_path, real_certs):
    # 5 of today's nine signed it with the same identities: 5 of N=9 is still a majority
    (c,) = ca.read_archive(consensus_path, certificates=real_certs).consensuses
    assert (c.n_signatures, c.n_valid) == (8, 5)
    got = ca.read_archive(consensus_path, certificates=real_certs, trusted=PINNED_2022[:4], n_authorities=9)
    assert got.consensuses == () and "4/8 signatures valid, 5 needed" in got.problems[0]


# --- a synthetic archive of three authorities -------------------------------------------

@pytest.fixture(scope="module")
def authorities():
    return [AuthorityKeys.generate(published=T0 - dt.timedelta(days=1), identity_bits=2048) for _ in range(3)]


def _routers():
    return [RouterStatus(nickname=f"relay{i}", identity=f"{i:02X}" * 20, address=f"10.0.0.{i}", orport=9001,
                         flags=("Fast", "Running", "Valid"), bandwidth=100 * i, version="Tor 0.4.8.13",
                         published=T0 - dt.timedelta(minutes=i)) for i in range(1, 4)]


def _hour(authorities, va, voted):
    votes = []
    for i, (keys, value) in enumerate(zip(authorities, voted, strict=True)):
        params = {"KISTSchedRunInterval": value} if value is not None else {}
        ident = AuthorityIdentity(f"auth{i}", "127.0.0.1", 7000 + i, 7100 + i, contact=f"op {i}")
        votes.append(render_vote(StatusHeader.hourly(va, params=params), ident, keys, _routers()))
    sources = [dir_source_for_vote(parse_network_status(v, "v")) for v in votes]
    values = sorted(v for v in voted if v is not None)
    consensus_value = values[(len(values) - 1) // 2]  # low median (dirspec-params.md §1.3)
    header = StatusHeader.hourly(va, params={"KISTSchedRunInterval": consensus_value, "cc_alg": 2})
    return votes, render_consensus(header, sources, _routers(), authorities)


@pytest.fixture(scope="module")
def archive(tmp_path_factory, authorities):
    root = tmp_path_factory.mktemp("collector") / "recent" / "relay-descriptors"
    (root / "consensuses").mkdir(parents=True)
    (root / "votes").mkdir()
    plan = {0: (2, 2, 2), 1: (2, 2, 3), 3: (3, 3, 2), 4: (3, 3, None)}  # hour 2 is missing
    for h, voted in plan.items():
        va = T0 + dt.timedelta(hours=h)
        stamp = va.strftime("%Y-%m-%d-%H-%M-%S")
        votes, consensus = _hour(authorities, va, voted)
        (root / "consensuses" / f"{stamp}-consensus").write_text(
            "@type network-status-consensus-3 1.0\n" + consensus)
        if h == 3:
            for i, v in enumerate(votes):
                (root / "votes" / f"{stamp}-vote-{authorities[i].v3ident}-X").write_text(v)
    # a consensus signed by one authority only: not enough of three
    _, lone = _hour(authorities[:1], T0 + dt.timedelta(hours=5), (9,))
    (root / "consensuses" / "2024-01-01-15-00-00-consensus").write_text(lone)
    (root / "README").write_text("not a directory document\n")
    certs = "".join(k.certificate_text for k in authorities)
    (root / "certs").mkdir()
    (root / "certs" / "all").write_text(certs)
    return root.parent.parent


def test_synthetic_archive_history_and_votes(archive, authorities, tmp_path):
    pins = [k.v3ident for k in authorities]
    got = ca.read_archive(archive, trusted=pins)
    assert [c.valid_after.hour for c in got.consensuses] == [10, 11, 13, 14]
    assert got.skipped == 1
    (problem,) = got.problems
    assert "2024-01-01-15-00-00-consensus: consensus not verified (1/1 signatures valid, 2 needed" in problem
    spans = ca.param_history(got.consensuses, "KISTSchedRunInterval")
    assert [(s.value, s.first.hour, s.last.hour, s.n_consensuses, s.after_gap) for s in spans] == [
        (2, 10, 11, 2, False), (3, 13, 14, 2, True)]
    assert [s.value for s in ca.param_history(got.consensuses, "absent_param")] == [None, None]
    voted = ca.votes_by_authority(got.votes, "KISTSchedRunInterval")
    assert voted == {T0 + dt.timedelta(hours=3): {"auth0": 3, "auth1": 3, "auth2": 2}}
    assert ca.value_in_consensus(got.consensuses, "KISTSchedRunInterval", T0 + dt.timedelta(hours=3, minutes=30)) == 3
    assert ca.value_in_consensus(got.consensuses, "KISTSchedRunInterval", T0 - dt.timedelta(hours=1)) is None
    # into the experiment database and back
    exp = ExperimentDir.create(tmp_path / "exp")
    store = MetricStore(exp.db)
    ca.save(store, got)
    ca.save(store, got)  # idempotent
    assert [c.params["KISTSchedRunInterval"] for c in store.consensuses()] == [2, 2, 3, 3]
    assert {v.nickname: v.params for v in store.votes()} == {"auth0": {"KISTSchedRunInterval": 3},
                                                             "auth1": {"KISTSchedRunInterval": 3},
                                                             "auth2": {"KISTSchedRunInterval": 2}}


def test_untrusted_authorities_do_not_count(archive, authorities):
    # trusting only two of the three: the two still sign every consensus (2 of N=2 needed)
    got = ca.read_archive(archive, trusted=[k.v3ident for k in authorities[:2]])
    assert len(got.consensuses) == 4
    assert all(c.n_valid == 2 for c in got.consensuses)
    # trusting none of them (today's nine): nothing verifies
    got = ca.read_archive(archive)
    assert got.consensuses == () and got.votes == ()
    assert all("not verified" in p for p in got.problems)


def test_tampered_vote_is_refused(tmp_path, authorities):
    votes, _ = _hour(authorities, T0, (2, 2, 2))
    (tmp_path / "v").write_text(votes[0].replace("KISTSchedRunInterval=2", "KISTSchedRunInterval=9"))
    certs = parse_key_certificates("".join(k.certificate_text for k in authorities), "certs")
    got = ca.read_archive(tmp_path / "v", certificates=certs, trusted=[k.v3ident for k in authorities])
    assert got.votes == () and "vote not verified" in got.problems[0]
    with pytest.raises(DocumentError):
        ca.strip_annotation(b"@type network-status-vote-3 7.1\nnetwork-status-version 3\n", "x")


@pytest.mark.parametrize("mode, suffix", [("w:xz", ".tar.xz"), ("w:gz", ".tar.gz"), ("w:bz2", ".tar.bz2")])
def test_truncated_compressed_tarball_keeps_what_was_read(tmp_path, authorities, mode, suffix):
    pins = [k.v3ident for k in authorities]
    path = tmp_path / f"consensuses-2024-01{suffix}"
    with tarfile.open(path, mode) as tar:
        certs = "".join(k.certificate_text for k in authorities).encode()
        for name, data in [("certs", certs)] + [
                (f"c{h}", _hour(authorities, T0 + dt.timedelta(hours=h), (2, 2, 2))[1].encode()) for h in range(3)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    whole = ca.read_archive(path, trusted=pins)
    assert len(whole.consensuses) == 3 and whole.problems == ()
    cut = tmp_path / f"cut{suffix}"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])
    got = ca.read_archive(cut, trusted=pins)
    assert len(got.consensuses) < 3
    assert any("unreadable tar archive" in p for p in got.problems)
