"""The cipher orch's SSH connections ask for (orchestrator/remote/ssh.py, AEAD_FIRST): AES-GCM
when the server has it, else what both sides have, against paramiko's server in this process
(the sandbox's OpenSSH is in tests/integration/test_forward_sandbox.py)."""

from __future__ import annotations

import pytest

from orchestrator.remote.paramiko_lib import paramiko
from orchestrator.remote.ssh import AEAD_FIRST, aead_first
from orchestrator.targets.fleet import Fleet
from tests.support.sshserver import SshServer


def test_aes_gcm_comes_first_and_nothing_is_dropped():
    ours = paramiko.Transport._preferred_ciphers
    order = aead_first(ours)
    assert order[:2] == AEAD_FIRST and sorted(order) == sorted(ours)
    assert aead_first(("aes128-ctr", "aes256-ctr")) == ("aes128-ctr", "aes256-ctr")


@pytest.mark.parametrize("offered, negotiated", [
    ((), "aes128-gcm@openssh.com"),                                  # paramiko's server has both
    (("aes256-ctr", "aes128-ctr"), "aes128-ctr"),                    # a server without GCM
    (("aes256-gcm@openssh.com", "aes128-ctr"), "aes256-gcm@openssh.com"),
])
def test_the_connection_negotiates_gcm_where_the_server_has_it(tmp_path, monkeypatch, offered, negotiated):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("ORCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    client_key = paramiko.ECDSAKey.generate()
    client_key.write_private_key_file(str(tmp_path / "id_ecdsa"))
    server = SshServer(client_key, ciphers=offered)
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{server.port} {server.host_key.get_name()} "
                     f"{server.host_key.get_base64()}\n")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  h1: {{address: 127.0.0.1, port: {server.port}, identity: "
                         f"{tmp_path}/id_ecdsa, known_hosts: {known}, connect_timeout: 5}}\n")
    try:
        with Fleet.from_path(str(inventory)) as fleet:
            transport = fleet.host("h1").connect()
            assert (transport.local_cipher, transport.remote_cipher) == (negotiated, negotiated)
    finally:
        server.close()
