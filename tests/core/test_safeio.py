"""Files named by a user are read only if they are regular files, in bounded chunks, up to a cap."""

import os
import subprocess
import sys

import pytest

from kistexp.dirauth.documents import load_key_certificates, load_network_status
from kistexp.errors import DocumentError, KistexpError, LocalNetError, PlanError
from kistexp.localnet import LocalNetwork
from kistexp.plan import load_plan
from kistexp.safeio import read_bounded, read_bounded_text


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def test_regular_file_read_whole_and_capped(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x" * 200_000)  # several chunks
    assert read_bounded(f, 200_000, "test") == b"x" * 200_000
    with pytest.raises(KistexpError, match=r"f: test file is 200000 bytes, larger than the 199999-byte limit"):
        read_bounded(f, 199_999, "test")
    (tmp_path / "bad").write_bytes(b"ok\xff")
    with pytest.raises(KistexpError, match=r"bad: test is not UTF-8 text \(byte 2\)"):
        read_bounded_text(tmp_path / "bad", 100, "test")


@pytest.mark.parametrize("where, found", [
    ("/dev/zero", "a character device"),
    ("/dev/null", "a character device"),
    ("/proc/self/status", "kernel file"),
    ("/proc/self/environ", "kernel file"),
    ("/sys/kernel/mm/transparent_hugepage/enabled", "kernel file"),
])
def test_devices_and_kernel_files_refused(where, found):
    if not os.path.exists(where):
        pytest.skip(f"{where} does not exist here")
    with pytest.raises(PlanError, match=f"^{where}: not a regular file .*{found}"):
        read_bounded(where, 1 << 20, "plan", PlanError)


def test_fifo_directory_and_symlinks_refused_without_blocking(tmp_path, fifo):
    with pytest.raises(PlanError, match="found a FIFO"):
        read_bounded(fifo, 1 << 20, "plan", PlanError)
    with pytest.raises(PlanError, match="found a directory"):
        read_bounded(tmp_path, 1 << 20, "plan", PlanError)
    link = tmp_path / "innocent.toml"
    link.symlink_to("/dev/zero")
    with pytest.raises(PlanError, match="innocent.toml: not a regular file .*character device"):
        read_bounded(link, 1 << 20, "plan", PlanError)
    proc_link = tmp_path / "p.toml"
    proc_link.symlink_to("/proc/self/status")
    with pytest.raises(PlanError, match="kernel file"):
        read_bounded(proc_link, 1 << 20, "plan", PlanError)
    with pytest.raises(PlanError, match="cannot read plan: no such file"):
        read_bounded(tmp_path / "none", 1 << 20, "plan", PlanError)


def test_every_document_entry_point_refuses(tmp_path, fifo):
    for load in (load_network_status, load_key_certificates):
        for bad in ("/dev/zero", fifo, tmp_path):
            with pytest.raises(DocumentError, match="not a regular file"):
                load(bad)
    for bad in ("/dev/zero", fifo, tmp_path):
        with pytest.raises(PlanError, match="not a regular file"):
            load_plan(bad)


def test_localnet_state_file_must_be_regular(tmp_path):
    os.mkfifo(tmp_path / "network.json")
    with pytest.raises(LocalNetError, match="network.json: not a regular file .*FIFO"):
        LocalNetwork.load(tmp_path)
    (tmp_path / "network.json").unlink()
    (tmp_path / "network.json").symlink_to("/dev/zero")
    with pytest.raises(LocalNetError, match="character device"):
        LocalNetwork.load(tmp_path)


def test_fake_authorities_state_files_must_be_regular(tmp_path):
    from fake_authorities.network import FakeAuthorityNetwork, NetworkError

    os.mkfifo(tmp_path / "operator-token")
    with pytest.raises(NetworkError, match="operator-token: not a regular file .*FIFO"):
        FakeAuthorityNetwork(count=1, interval_s=10, listen=False, state_dir=tmp_path)


@pytest.mark.parametrize("argv", [
    ["show", "{zero}"], ["lint", "{fifo}"], ["show", "{dir}"], ["lint", "/proc/self/status"],
    ["consensus", "inspect", "{zero}"], ["consensus", "inspect", "{fifo}"],
    ["consensus", "inspect", "{consensus}", "--certs", "{fifo}"],
    ["consensus", "inspect", "{consensus}", "--certs", "{zero}"],
    ["authorities", "status", "--certs", "{fifo}", "--authority", "a=127.0.0.1:9"],
])
def test_cli_one_line_error_not_hang(tmp_path, fifo, argv, microdesc_consensus_path):
    values = {"zero": "/dev/zero", "fifo": str(fifo), "dir": str(tmp_path), "consensus": str(microdesc_consensus_path)}
    argv = [a.format(**values) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "kistexp", *argv], capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out
    assert "not a regular file" in out, out
    if argv[0] != "lint":
        assert proc.stderr.startswith("kistexp: error: ") and proc.stderr.count("\n") == 1, proc.stderr
