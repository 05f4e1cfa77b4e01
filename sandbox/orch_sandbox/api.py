"""The sandbox hosts' HTTPS API (port 8006): certificates, the API token, the daemon.

As on a fresh Proxmox node: a cluster CA (/etc/pve/pve-root-ca.pem) signs each node's
certificate (/etc/pve/nodes/NODE/pve-ssl.pem), which no client trusts until told to.
One API token, root@pam!orch, is made once per state directory (kept, like the SSH keys)
and listed in /etc/pve/priv/token.cfg; tests read its secret with `token_secret(paths)`.
The daemon (bin/pveproxy) runs inside the host's namespaces like its sshd.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import uuid
from pathlib import Path

from .layout import HOST_ADDRESS, HostSpec
from .paths import StatePaths
from .system import SandboxError, alive, cmdline, in_host, move_to_cgroup, read_pid, wait_for

TOKEN_ID = "root@pam!orch"
PORT = 8006


def ca_files(paths: StatePaths) -> tuple[Path, Path]:
    return paths.root / "keys" / "pve-root-ca.pem", paths.root / "keys" / "pve-root-ca.key"


def token_file(paths: StatePaths) -> Path:
    return paths.root / "keys" / "api-token"


def token_secret(paths: StatePaths) -> str:
    return token_file(paths).read_text().strip()


def pid_file(paths: StatePaths, host: str) -> Path:
    return paths.host_dir(host) / "pveproxy.pid"


def log_file(paths: StatePaths, host: str) -> Path:
    return paths.logs / f"{host}-pveproxy.log"


def url(spec: HostSpec) -> str:
    return f"https://[{spec.address}]:{PORT}"


# --- keys, written once ------------------------------------------------------------------------

def ensure_credentials(paths: StatePaths) -> None:
    """The sandbox's CA and API token secret, made once and kept across up/down."""
    cert_path, key_path = ca_files(paths)
    cert_path.parent.mkdir(parents=True, exist_ok=True)
    if not (cert_path.exists() and key_path.exists()):
        key = _new_key()
        name = _name("Proxmox Virtual Environment (orch sandbox)")
        builder = (_builder(name, name, key.public_key(), days=3650)
                   .add_extension(_x509().BasicConstraints(ca=True, path_length=None), critical=True))
        _write_pair(builder.sign(key, _sha256()), key, cert_path, key_path)
    token = token_file(paths)
    if not token.exists():
        token.write_text(str(uuid.uuid4()) + "\n")
        os.chmod(token, 0o600)


def write_node_files(paths: StatePaths, spec: HostSpec, pve_dir: Path) -> None:
    """The node's certificate (signed by the CA), token.cfg and the CA in /etc/pve."""
    from cryptography.hazmat.primitives import serialization

    ca_cert_path, ca_key_path = ca_files(paths)
    node_dir = pve_dir / "nodes" / spec.name
    node_dir.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = node_dir / "pve-ssl.pem", node_dir / "pve-ssl.key"
    ca_pem = ca_cert_path.read_bytes()
    if not (cert_path.exists() and key_path.exists()) or not _signed_by(cert_path, ca_pem):
        x509 = _x509()
        ca_cert = x509.load_pem_x509_certificate(ca_pem)
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        key = _new_key()
        names = x509.SubjectAlternativeName([
            x509.DNSName(spec.name), x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address(HOST_ADDRESS))])
        builder = (_builder(_name(f"{spec.name}.orch-sandbox"), ca_cert.subject,
                            key.public_key(), days=700)
                   .add_extension(names, critical=False))
        _write_pair(builder.sign(ca_key, _sha256()), key, cert_path, key_path)
    (pve_dir / "pve-root-ca.pem").write_bytes(ca_pem)
    private = pve_dir / "priv"
    private.mkdir(mode=0o700, exist_ok=True)
    token_cfg = private / "token.cfg"
    token_cfg.write_text(f"{TOKEN_ID} {token_secret(paths)}\n")
    os.chmod(token_cfg, 0o600)


def fingerprint(paths: StatePaths, spec: HostSpec, pve_dir: Path) -> str:
    """SHA-256 of the node certificate, AA:BB:... as Proxmox shows it."""
    x509 = _x509()
    cert = x509.load_pem_x509_certificate((pve_dir / "nodes" / spec.name / "pve-ssl.pem").read_bytes())
    digest = cert.fingerprint(_sha256())
    return ":".join(f"{byte:02X}" for byte in digest)


def _signed_by(cert_path: Path, ca_pem: bytes) -> bool:
    x509 = _x509()
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    return cert.issuer == x509.load_pem_x509_certificate(ca_pem).subject


def _x509():
    from cryptography import x509
    return x509


def _sha256():
    from cryptography.hazmat.primitives import hashes
    return hashes.SHA256()


def _new_key():
    from cryptography.hazmat.primitives.asymmetric import ec
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str):
    x509 = _x509()
    from cryptography.x509.oid import NameOID
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject, issuer, public_key, days: int):
    x509 = _x509()
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=days)))


def _write_pair(cert, key, cert_path: Path, key_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.TraditionalOpenSSL,
                                           serialization.NoEncryption()))
    os.chmod(key_path, 0o600)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


# --- the daemon -----------------------------------------------------------------------------------

def running_pid(paths: StatePaths, host: str) -> int | None:
    pid = read_pid(pid_file(paths, host))
    if alive(pid) and any(arg.endswith("/pveproxy") for arg in cmdline(pid)):
        return pid
    return None


def start(paths: StatePaths, spec: HostSpec, holder: int) -> int:
    """Start the host's API daemon unless it runs; returns its PID once it listens."""
    pid = running_pid(paths, spec.name)
    if pid is not None:
        return pid
    target = pid_file(paths, spec.name)
    target.unlink(missing_ok=True)
    # the daemon writes to its log, never to a pipe of ours (it outlives this call)
    with open(log_file(paths, spec.name), "ab") as log:
        subprocess.run(in_host(holder, ["setsid", "--fork", "/usr/bin/python3", "-ES",
                                        str(paths.bin_dir / "pveproxy"), str(target)]),
                       stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/",
                       timeout=10, check=False)
    if not wait_for(lambda: running_pid(paths, spec.name) is not None, timeout=10):
        raise SandboxError(f"host {spec.name}: the API daemon did not start; "
                           f"see {log_file(paths, spec.name)}")
    pid = running_pid(paths, spec.name)
    move_to_cgroup(pid, f"{spec.cgroup}/host")
    return pid
