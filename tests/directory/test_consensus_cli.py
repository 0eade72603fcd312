"""`kistexp consensus inspect`: in process through typer's CliRunner (the consensus sub-app alone) and
once through the real entry point (exit code and the one-line `kistexp: error:` message)."""

from __future__ import annotations

import json
import subprocess
import sys

import attrs
import typer
from conftest import SHARED_DATA
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kistexp.commands import consensus as consensus_cmd
from kistexp.errors import KistexpError


@attrs.frozen
class Outcome:
    returncode: int
    stdout: str
    stderr: str


def _run(*args: str) -> Outcome:
    app = typer.Typer()
    consensus_cmd.register(app)
    result = CliRunner().invoke(app, ["consensus", "inspect", *args])
    if isinstance(result.exception, KistexpError):
        # what kistexp.cli.main prints for any KistexpError
        return Outcome(1, result.stdout, f"kistexp: error: {result.exception}\n")
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return Outcome(result.exit_code, result.stdout, "")


def _run_entry_point(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kistexp", "consensus", "inspect", *args],
        capture_output=True, text=True, timeout=60,
    )


DOCS = {"md": (SHARED_DATA / "microdesc-consensus-2022-11-19").read_bytes(),
        "certs": (SHARED_DATA / "cached-certs").read_bytes()}

# The shared documents are of November 2022: the nine authorities of tor 0.4.7.10 signed them.
ERA = ("--authority-set", "tor-0.4.7.10")


def test_inspect_real_consensus_with_certs(consensus_path, certs_path):
    res = _run(str(consensus_path), "--certs", str(certs_path), "--json", *ERA)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["flavor"] == "ns" and out["vote_status"] == "consensus"
    assert out["valid_after"] == "2022-11-19T10:00:00Z"
    assert out["fresh_until"] == "2022-11-19T11:00:00Z"
    assert out["valid_until"] == "2022-11-19T13:00:00Z"
    assert out["relay_count"] == 6088
    assert out["params"]["KISTSchedRunInterval"] == 2
    sig = out["signatures"]
    assert (sig["valid"], sig["total"], sig["needed"], sig["ok"]) == (8, 8, 5, True)
    assert out["verified"] is True and out["other_certificates"] == []
    assert len(out["trusted_authorities"]) == 9


def test_inspect_counts_only_pinned_identities(consensus_path, certs_path):
    # Today's nine: moria1, tor26 and Faravahar have new identities since, so their 2022
    # signatures come from authorities nobody configures now, and their certificates are ignored.
    res = _run(str(consensus_path), "--certs", str(certs_path), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    sig = out["signatures"]
    assert (sig["valid"], sig["total"], sig["needed"], sig["n_authorities"]) == (5, 8, 5, 9)
    assert sorted(x["identity"] for x in sig["per_signature"] if x["status"] == "unknown authority") == [
        "14C131DFC5C6F93646BE72FA1401C02A8DF2E8B4", "D586D18309DED4CD6D57C18FDB97EFA96D330566",
        "EFCBE720AB3A82B99F9E953CD5BF50F7EEFC7B97"]
    assert out["other_certificates"] == sorted(x["identity"] for x in sig["per_signature"]
                                               if x["status"] == "unknown authority")
    human = _run(str(consensus_path), "--certs", str(certs_path))
    assert "ignored      certificates of 3 identities that are not trusted authorities" in human.stdout


def test_inspect_without_certs_says_nothing_is_verified(consensus_path):
    res = _run(str(consensus_path))
    assert res.returncode == 0
    assert "NOT VERIFIED" in res.stdout
    out = json.loads(_run(str(consensus_path), "--json").stdout)
    assert out["verified"] is False and out["signatures"] is None


def test_inspect_human_output(microdesc_consensus_path, certs_path):
    res = _run(str(microdesc_consensus_path), "--certs", str(certs_path), *ERA)
    assert res.returncode == 0, res.stderr
    assert "microdesc consensus" in res.stdout
    assert "KISTSchedRunInterval=2" in res.stdout
    assert "8/8 valid, 5 needed" in res.stdout


def test_inspect_corrupted_copy_fails(tmp_path, consensus_path, certs_path):
    data = consensus_path.read_bytes().replace(b"KISTSchedRunInterval=2", b"KISTSchedRunInterval=3", 1)
    forged = tmp_path / "forged-consensus"
    forged.write_bytes(data)
    res = _run_entry_point(str(forged), "--certs", str(certs_path), *ERA)
    assert res.returncode == 1
    err = res.stderr.strip()
    assert err.count("\n") == 0
    assert err.startswith(f"kistexp: error: {forged}: not enough valid signatures: 0/8")
    # without certificates it is only inspected
    res = _run(str(forged), "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["params"]["KISTSchedRunInterval"] == 3


def test_inspect_bad_files(tmp_path, consensus_path, certs_path):
    truncated = tmp_path / "truncated"
    truncated.write_bytes(consensus_path.read_bytes()[:100_000])
    for path, expected in ((truncated, "truncated"), (tmp_path / "missing", "cannot read")):
        res = _run(str(path))
        assert res.returncode == 1
        assert res.stderr.startswith(f"kistexp: error: {path}") and expected in res.stderr
        assert res.stderr.strip().count("\n") == 0 and "Traceback" not in res.stderr
    # more configured authorities than signers: 8 valid < 9 needed for N=17
    res = _run(str(consensus_path), "--certs", str(certs_path), "--n-authorities", "17", *ERA)
    assert res.returncode == 1 and "8/8 signatures valid, 9 needed (N=17)" in res.stderr


def _forgery(tmp_path, certs_path, n: int = 9):
    """A consensus signed by ``n`` fresh keys that name themselves as its authorities, and two
    certificate files: cached-certs plus the forged certificates, and the forged ones alone."""
    import datetime as dt

    from kistexp.dirauth import documents
    from kistexp.dirauth.keys import AuthorityKeys

    va = dt.datetime(2022, 11, 19, 10, tzinfo=dt.timezone.utc)
    fresh = [AuthorityKeys.generate(published=va - dt.timedelta(days=1), identity_bits=1024, signing_bits=1024)
             for _ in range(n)]
    sources = [documents.DirSource(f"fake{i}", k.v3ident, "127.0.0.1", "127.0.0.1", 80, 443, "c", "A" * 40)
               for i, k in enumerate(fresh)]
    header = documents.StatusHeader.hourly(va, params={"KISTSchedRunInterval": 77})
    doc = tmp_path / "forged"
    doc.write_text(documents.render_consensus(header, sources, [], fresh, flavor="ns"))
    forged_certs = "".join(k.certificate_text for k in fresh)
    both = tmp_path / "cached-plus-forged"
    both.write_text(certs_path.read_text() + forged_certs)
    alone = tmp_path / "forged-certs"
    alone.write_text(forged_certs)
    return doc, both, alone, fresh


def test_inspect_refuses_padded_certificate_file(tmp_path, certs_path):
    doc, both, alone, fresh = _forgery(tmp_path, certs_path)
    # 18 identities for 9 authorities: refused outright (it used to verify 9/9).
    res = _run(str(doc), "--certs", str(both))
    assert res.returncode == 1
    assert "holds certificates for 18 identities, more than the 9 trusted authorities" in res.stderr
    # 9 identities, none of them pinned: no signature counts.
    res = _run(str(doc), "--certs", str(alone), "--json")
    assert res.returncode == 1 and "0/9 signatures valid, 5 needed (N=9); 9 unknown authority" in res.stderr
    out = json.loads(res.stdout)
    assert out["verified"] is False and len(out["other_certificates"]) == 9
    # Trusting those identities explicitly is the operator's choice, and then they verify.
    pins = [a for i, k in enumerate(fresh) for a in ("--v3ident", f"fake{i}={k.v3ident.lower()}")]
    res = _run(str(doc), "--certs", str(alone), "--json", *pins)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["verified"] is True


def test_inspect_trust_options_are_validated(consensus_path, certs_path):
    cases = [
        (("--v3ident", "moria1=" + "A" * 40 + "\n"), "is not a v3ident"),
        (("--v3ident", "moria1\n=" + "A" * 40), "is not a tor nickname"),
        (("--v3ident", "A" * 40), "expected NICK=V3IDENT"),
        (("--v3ident", "a=" + "A" * 40, "--v3ident", "b=" + "a" * 40), "is given twice"),
        (("--authority-set", "bogus"), "--authority-set 'bogus': unknown"),
        (("--n-authorities", "3"), "--n-authorities 3 is fewer than the 9 trusted authorities"),
    ]
    for args, message in cases:
        res = _run(str(consensus_path), "--certs", str(certs_path), *args)
        assert res.returncode == 1 and message in res.stderr, (args, res)




def test_inspect_prints_document_text_and_file_names_as_text(tmp_path):
    import datetime as dt

    from kistexp.dirauth import documents
    from kistexp.dirauth.keys import AuthorityKeys

    va = dt.datetime(2024, 1, 1, 12, tzinfo=dt.timezone.utc)
    keys = AuthorityKeys.generate(published=va - dt.timedelta(days=1), identity_bits=1024, signing_bits=1024)
    header = documents.StatusHeader.hourly(va, params={"[/red]": 1, "[bold]k\x1b[2J": 2})
    source = documents.DirSource("auth0", keys.v3ident, "127.0.0.1", "127.0.0.1", 80, 443, "c", "A" * 40)
    doc = tmp_path / "consensus\x1b]0;pwned\x07[bold red]"  # no "/" in a file name
    doc.write_text(documents.render_consensus(header, [source], [], [keys], flavor="ns"))
    certs = tmp_path / "certs"
    certs.write_text(keys.certificate_text)
    res = _run(str(doc), "--certs", str(certs), "--v3ident", f"auth0={keys.v3ident}")
    assert res.returncode == 0, res.stderr
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout
    assert "consensus\\x1b]0;pwned\\x07[bold red]: ns consensus" in res.stdout
    assert "[/red]=1 [bold]k\\x1b[2J=2" in res.stdout


@settings(max_examples=40, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_inspect_any_document_gives_a_report_or_one_line_error(tmp_path, microdesc_consensus_path, certs_path, data):
    # Random cuts and insertions in the real microdesc consensus and in cached-certs.
    def mangle(raw: bytes) -> bytes:
        for _ in range(data.draw(st.integers(0, 2))):
            i = data.draw(st.integers(0, len(raw)))
            j = min(len(raw), i + data.draw(st.integers(0, 3000)))
            raw = raw[:i] + data.draw(st.sampled_from([b"", b"\n", b"\x00", b"[/red]", b"\x1b]0;x\x07", b"9" * 50,
                                                       b"-----BEGIN RSA PUBLIC KEY-----\n"])) + raw[j:]
        return raw

    doc, certs = tmp_path / "doc", tmp_path / "certs"
    doc.write_bytes(mangle(DOCS["md"]))
    certs.write_bytes(mangle(DOCS["certs"]))
    res = _run(str(doc), "--certs", str(certs), *ERA)
    assert res.returncode in (0, 1)
    if res.returncode == 1:
        assert res.stderr.startswith("kistexp: error: ") and res.stderr.strip().count("\n") == 0
    assert "\x1b" not in res.stdout


def test_inspect_has_no_flavour_option_and_says_so(consensus_path):
    res = _run(str(consensus_path), "--flavour", "bogus")
    assert res.returncode != 0
