"""The consensus, key certificates and GeoIP table bundled with the package (issue 33, point 1): used by
default, checked when read, and every damaged or wrong file is one line naming it."""

from __future__ import annotations

import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kistexp.errors import PopulationError
from kistexp.population import bundled
from kistexp.population.geoip import _load_geoip, load_geoip
from kistexp.population.relays import load_population

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "kistexp" / "data"
# a relay of the 2022-11-19 consensus and its country in tor's GeoIP table
KNOWN_RELAY = ("ForPrivacyNET", "0036FA36AB435FD5D0F640626636867EBFB72C68", "185.220.101.33", "DE")


@pytest.fixture
def fresh_geoip_cache():
    _load_geoip.cache_clear()
    yield
    _load_geoip.cache_clear()


def test_bundled_files_are_small_xz_and_declared():
    sizes = {p.name: p.stat().st_size for p in DATA.glob("*.xz")}
    assert set(sizes) == {bundled.BUNDLED_CONSENSUS, bundled.BUNDLED_CERTS, bundled.BUNDLED_GEOIP}
    assert sum(sizes.values()) < 2_500_000
    for name in sizes:
        assert (DATA / name).read_bytes().startswith(bundled.XZ_MAGIC)
    text = (REPO / "pyproject.toml").read_text()
    assert '"data/*.xz"' in text


def test_bundled_copies_equal_their_sources(shared_data):
    """The bundled consensus and certificates are the shared files byte for byte; the GeoIP table keeps
    tor's header (its source and licence)."""
    for name, source in ((bundled.BUNDLED_CONSENSUS, "consensus-2022-11-19-10-00-00"),
                         (bundled.BUNDLED_CERTS, "cached-certs")):
        assert lzma.decompress((DATA / name).read_bytes()) == (shared_data / source).read_bytes()
    head = lzma.decompress((DATA / bundled.BUNDLED_GEOIP).read_bytes())[:1500].decode()
    assert "IPFire Location database" in head and "License:   CC BY-SA 4.0" in head


def test_defaults_load_the_bundled_consensus_and_geoip(fresh_geoip_cache):
    pop = load_population()
    assert len(pop) == bundled.BUNDLED_RELAYS == 6088
    assert pop.source == str(DATA / bundled.BUNDLED_CONSENSUS)
    geoip = load_geoip()
    assert geoip.source == str(DATA / bundled.BUNDLED_GEOIP) and len(geoip) > 300_000
    nick, fp, address, country = KNOWN_RELAY
    (relay,) = [r for r in pop.relays if r.fingerprint == fp]
    assert (relay.nickname, relay.address) == (nick, address)
    assert geoip.lookup(relay.address) == country


# The defaults with ../shared and tor's GeoIP file out of reach: a child process whose every open() of a
# path under them fails (an audit hook cannot be removed, hence the child).
_CHILD = r"""
import json, os, sys
blocked = tuple(sys.argv[1:])

def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.realpath(os.fsdecode(args[0]))
        if path.startswith(blocked):
            raise PermissionError(13, "blocked by the test", path)

sys.addaudithook(hook)
for path in blocked:  # the hook works: nothing under the blocked paths can be opened
    try:
        open(os.path.join(path, "geoip")).close()
    except PermissionError as exc:
        assert exc.strerror == "blocked by the test", exc
    else:
        raise SystemExit(f"{path} is still readable")

from typer.testing import CliRunner
from kistexp.cli import app
from kistexp.population.geoip import load_geoip
from kistexp.population.predict import simulate_plan  # noqa: F401 - the simulate code path imports
from kistexp.population.relays import load_population
from kistexp.population.sampling import sample
from kistexp.population.simnet import TrafficModel, build_network

pop = load_population()
geoip = load_geoip()
net = build_network(sample(pop, 0.005, 1), duration_s=12, seed=1, interval_ms=10, traffic=TrafficModel())
summary = CliRunner().invoke(app, ["population", "summary", "--scale", "0.01", "--json"])
assert summary.exit_code == 0, summary.output
print(json.dumps({"relays": len(pop), "source": pop.source, "geoip": geoip.source,
                  "countries": {r.fingerprint: geoip.lookup(r.address) for r in pop.relays},
                  "sampled": len(net.population), "summary": json.loads(summary.stdout)}))
"""


@pytest.mark.slow
def test_bundled_data_is_used_when_shared_and_tor_geoip_are_unreadable(tmp_path):
    blocked = [str((REPO.parent / "shared").resolve()), "/usr/share/tor"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", _CHILD, *blocked], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["relays"] == 6088
    assert out["source"].endswith("kistexp/data/consensus-2022-11-19-10-00-00.xz")
    assert out["geoip"].endswith("kistexp/data/geoip.xz")
    assert out["countries"][KNOWN_RELAY[1]] == KNOWN_RELAY[3]
    assert out["sampled"] == 30
    summary = out["summary"]
    assert summary["source"] == f"{out['source']} scale 0.01 seed 1" and summary["relays"] == 61
    assert {row["key"] for row in summary["countries"]} >= {"DE", "US"}


# --- a damaged bundled file ---------------------------------------------------------------------------


def _point_bundled_at(monkeypatch, folder: Path) -> None:
    """Make ``folder`` the package's data directory (only for the bundled files read through it)."""
    monkeypatch.setattr(bundled, "bundled_file", lambda name: folder / name)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda data: data[: len(data) // 2], "truncated GeoIP table: the xz stream ends early"),
    (lambda data: data[:100] + bytes(b ^ 0xFF for b in data[100:200]) + data[200:], "corrupt GeoIP table"),
    (lambda data: b"not xz at all\n" + data, "corrupt GeoIP table: not a valid xz stream"),
    (lambda data: lzma.compress(b"1,2,US\n3,x,DE\n", format=lzma.FORMAT_XZ), "line 2: expected LOW,HIGH,CC"),
    (lambda data: lzma.compress(bytes(range(256)) * 4, format=lzma.FORMAT_XZ), "not a tor GeoIP file"),
])
def test_a_damaged_bundled_geoip_is_one_line(tmp_path, monkeypatch, fresh_geoip_cache, damage, message):
    (tmp_path / bundled.BUNDLED_GEOIP).write_bytes(damage((DATA / bundled.BUNDLED_GEOIP).read_bytes()))
    _point_bundled_at(monkeypatch, tmp_path)
    with pytest.raises(PopulationError) as err:
        load_geoip()
    text = str(err.value)
    assert "\n" not in text and text.startswith(str(tmp_path / bundled.BUNDLED_GEOIP)) and message in text


def test_a_missing_bundled_file_says_reinstall(tmp_path, monkeypatch, fresh_geoip_cache):
    _point_bundled_at(monkeypatch, tmp_path)
    with pytest.raises(PopulationError, match=r"geoip.xz: bundled GeoIP table is missing from the installed "
                                              r"package \(reinstall kistexp\)"):
        load_geoip()


def test_a_huge_bundled_file_is_refused_without_decompressing_it_all(tmp_path, monkeypatch, fresh_geoip_cache):
    bomb = lzma.compress(b"\n" * (65 * 1024 * 1024), format=lzma.FORMAT_XZ)  # 10 KB that would be 65 MiB
    (tmp_path / bundled.BUNDLED_GEOIP).write_bytes(bomb)
    _point_bundled_at(monkeypatch, tmp_path)
    with pytest.raises(PopulationError, match="GeoIP table decompresses to more than the 67108864-byte limit"):
        load_geoip()


def test_an_altered_bundled_consensus_fails_its_signature_check(tmp_path, monkeypatch):
    text = lzma.decompress((DATA / bundled.BUNDLED_CONSENSUS).read_bytes())
    forged = text.replace(b"r ForPrivacyNET ", b"r ForPrivacyNEU ", 1)
    assert forged != text
    (tmp_path / bundled.BUNDLED_CONSENSUS).write_bytes(lzma.compress(forged, format=lzma.FORMAT_XZ))
    (tmp_path / bundled.BUNDLED_CERTS).write_bytes((DATA / bundled.BUNDLED_CERTS).read_bytes())
    _point_bundled_at(monkeypatch, tmp_path)
    with pytest.raises(PopulationError) as err:
        load_population()
    assert str(err.value) == (f"{tmp_path / bundled.BUNDLED_CONSENSUS}: consensus rejected (forged, altered or "
                              "signed by other authorities): 0/8 signatures valid, 5 needed (N=9); 8 bad signature")


def test_a_truncated_bundled_consensus_is_named(tmp_path, monkeypatch):
    data = (DATA / bundled.BUNDLED_CONSENSUS).read_bytes()
    (tmp_path / bundled.BUNDLED_CONSENSUS).write_bytes(data[:-5000])
    _point_bundled_at(monkeypatch, tmp_path)
    with pytest.raises(PopulationError, match=r"consensus-2022-11-19-10-00-00.xz: truncated consensus"):
        load_population()


# --- user-given files ------------------------------------------------------------------------------------


def test_a_user_geoip_wins_and_may_be_xz(tmp_path, fresh_geoip_cache):
    plain = tmp_path / "geoip"
    plain.write_text("# a tiny table\n16777216,16777471,AU\n3098804224,3098804479,DE\n")
    assert load_geoip(plain).lookup("1.0.0.7") == "AU"
    packed = tmp_path / "geoip.xz"
    packed.write_bytes(lzma.compress(plain.read_bytes(), format=lzma.FORMAT_XZ))
    table = load_geoip(packed)
    assert table.source == str(packed) and len(table) == 2 and table.lookup("184.180.0.1") == "DE"


@pytest.mark.parametrize(("content", "message"), [
    (b"\xff\xfe\x00binary", "not a tor GeoIP file: non-ASCII byte at offset 0"),
    (b"\x00\x01\x02binary", "line 1: expected LOW,HIGH,CC, got '\\x00\\x01\\x02binary'"),
    (b"1,2,US\n5,4,DE\n", "line 2: expected LOW,HIGH,CC"),
    (b"10,20,US\n15,30,DE\n", "line 2: range not sorted or overlaps the previous one"),
    (b"1,2,U1\n", "line 1: expected LOW,HIGH,CC"),
    (b"# geoip6\n2001::,2001:0:ffff::,US\n", "line 2: an IPv6 range (tor's geoip6 file?)"),
    (b"# only comments\n", "no GeoIP ranges"),
    (lzma.compress(b"1,2,US\n", format=lzma.FORMAT_XZ)[:-20], "truncated GeoIP file"),
])
def test_a_corrupt_user_geoip_is_one_line(tmp_path, fresh_geoip_cache, content, message):
    path = tmp_path / "my-geoip"
    path.write_bytes(content)
    with pytest.raises(PopulationError) as err:
        load_geoip(path)
    assert "\n" not in str(err.value) and str(err.value).startswith(str(path)) and message in str(err.value)


def test_a_directory_or_device_as_geoip_is_refused(tmp_path, fresh_geoip_cache):
    with pytest.raises(PopulationError, match="not a regular file"):
        load_geoip(tmp_path)
    with pytest.raises(PopulationError, match="not a regular file"):
        load_geoip("/dev/zero")


def test_a_user_consensus_is_verified_with_certs(tmp_path, consensus_path, certs_path):
    pop = load_population(consensus_path, certs=certs_path)
    assert len(pop) == 6088 and pop.source == str(consensus_path)
    forged = tmp_path / "forged-consensus"
    forged.write_bytes(consensus_path.read_bytes().replace(b" 185.220.101.33 ", b" 185.220.101.34 ", 1))
    load_population(forged)  # without certificates only the form is checked
    with pytest.raises(PopulationError) as err:
        load_population(forged, certs=certs_path)
    assert str(err.value).startswith(f"{forged}: consensus rejected") and "0/8 signatures valid" in str(err.value)
    packed = tmp_path / "consensus.xz"
    packed.write_bytes(lzma.compress(consensus_path.read_bytes(), format=lzma.FORMAT_XZ))
    assert len(load_population(packed, certs=certs_path)) == 6088
    with pytest.raises(PopulationError, match="not-certs: no key certificates|not-certs"):
        bad = tmp_path / "not-certs"
        bad.write_text("hello\n")
        load_population(consensus_path, certs=bad)


def test_population_cli_takes_a_consensus_and_certs(tmp_path, consensus_path, certs_path):
    from typer.testing import CliRunner

    from kistexp.cli import app

    ok = CliRunner().invoke(app, ["population", "summary", str(consensus_path), "--certs", str(certs_path),
                                  "--scale", "0.01", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["source"] == f"{consensus_path} scale 0.01 seed 1"
    truncated = tmp_path / "truncated"
    truncated.write_bytes(consensus_path.read_bytes()[:400_000])
    bad = CliRunner().invoke(app, ["population", "paths", str(truncated), "--circuits", "10", "--json"])
    assert bad.exit_code == 1 and str(truncated) in str(bad.exception) and "truncated" in str(bad.exception)
