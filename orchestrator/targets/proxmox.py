"""The Proxmox API through proxmoxer's resource tree: container list, status, start, tasks.

Two ways in, chosen per host in the inventory (`api:`), both plugged into proxmoxer as a
session object:
- backend "ssh" (default): `pvesh VERB PATH ... --output-format json` on the host through
  orch's own SSH connection (host keys checked). Success is pvesh's exit code and the JSON
  on stdout's last line; anything else on stderr (a Perl locale warning) is kept as a
  warning. proxmoxer's own command backend judges by stderr alone, which turns such a
  warning into an error and a failed start (UPID on stdout, exit 0) into a success.
- backend "https": the HTTPS API (port 8006) with an API token whose secret is read from
  the environment variable the inventory names (never from the file, never printed). The
  certificate must verify against the system CAs, the inventory's `ca_file`, or match its
  `fingerprint` (SHA-256): verification is never turned off.

A start is a task: orch follows /nodes/NODE/tasks/UPID/status to its end and reports the
task's own error. See docs/design/proxmox-semantics.md.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import socket
import ssl
import time
import urllib.parse
from typing import Callable, Optional

from proxmoxer import ResourceException
from proxmoxer.backends.command_base import JsonSimpleSerializer
from proxmoxer.core import ProxmoxResource

from orchestrator.config.inventory import HostSpec
from orchestrator.ground import invocation
from orchestrator.ground.errors import (ConfigError, HostUnreachable, NoSuchContainer, OrchError)
from orchestrator.remote.base import Transport

API_TIMEOUT = 30.0
TASK_POLL_S = 0.2
RUNNING_POLL_S = 0.3   # after the start task: until the container's status says running
HTTP_STATUS = re.compile(r"^(\d\d\d) ")


class ApiResponse:
    """What proxmoxer's ProxmoxResource reads from a session's answer."""

    def __init__(self, status_code: int, reason: str, content: bytes):
        self.status_code = status_code
        self.reason = reason
        self.content = content
        self.text = content.decode("utf-8", "replace")
        self.headers = {"content-type": "application/json"}


class TaskFailed(OrchError):
    """A Proxmox task (UPID) ended with an error."""


# ---------------------------------------------------------------- pvesh over SSH
class PveshSession:
    """pvesh through orch's transport, judged by its exit code, not by its stderr."""

    def __init__(self, host: Transport, warn: Callable[[str], None]):
        self.host = host
        self.timeout = API_TIMEOUT
        self.warn = warn

    def request(self, method, url, data=None, params=None, headers=None):
        verb = {"post": "create", "put": "set"}.get(method.lower(), method.lower())
        argv = ["pvesh", verb, url.strip()]
        for key, value in {**(data or {}), **(params or {})}.items():
            argv += [f"-{key}", value.decode() if isinstance(value, bytes) else str(value)]
        result = self.host.run(argv + ["--output-format", "json"], timeout=self.timeout)
        if result.exit_code != 0:
            error = result.error_text.strip() or f"pvesh exited {result.exit_code}"
            coded = next((HTTP_STATUS.match(line) for line in error.splitlines()
                          if HTTP_STATUS.match(line)), None)
            return ApiResponse(int(coded.group(1)) if coded else 500, " ".join(error.split("\n")),
                               b"")
        lines = [line for line in result.text.splitlines() if line.strip()]
        try:
            json.loads(lines[-1])
        except (IndexError, ValueError):
            raise OrchError(f"host {self.host.name}: `pvesh {verb} {url}` printed no JSON: "
                            f"{(result.text + result.error_text).strip()[:300]}") from None
        # a task's own output (a hookscript's) can come before the answer
        for line in result.error_text.splitlines():
            if line.strip():
                self.warn(f"host {self.host.name}: pvesh said on stderr: {line.strip()}")
        return ApiResponse(200, "OK", lines[-1].encode())


# ---------------------------------------------------------------- HTTPS with an API token
class HttpsSession:
    """One HTTPS request per call to https://HOST:PORT, certificate checked before the token
    is sent. Link-local IPv6 (`[fe80::2%eth0]`) works, which requests cannot do."""

    def __init__(self, host_name: str, url: str, token_id: str, secret: str,
                 ca_file: Optional[str], fingerprint: Optional[str]):
        self.host_name = host_name
        self.address, self.port = _split_url(host_name, url)
        self.token_id = token_id
        self._authorization = f"PVEAPIToken={token_id}={secret}"
        self.ca_file = ca_file
        self.fingerprint = fingerprint
        self.timeout = API_TIMEOUT

    def __repr__(self):   # never the secret
        return f"HttpsSession({self.address}:{self.port}, token {self.token_id})"

    def request(self, method, url, data=None, params=None, headers=None):
        path = urllib.parse.urlsplit(url).path
        query = urllib.parse.urlencode(params or {})
        body = urllib.parse.urlencode(data or {}).encode()
        request_headers = {"Authorization": self._authorization, "Accept": "application/json"}
        if body:
            request_headers["Content-Type"] = "application/x-www-form-urlencoded"
        connection = self._connect()
        try:
            connection.request(method.upper(), path + (f"?{query}" if query else ""),
                               body=body or None, headers=request_headers)
            answer = connection.getresponse()
            return ApiResponse(answer.status, answer.reason, answer.read())
        except (OSError, http.client.HTTPException) as error:
            raise HostUnreachable(f"Proxmox API on host {self.host_name} "
                                  f"({self.address} port {self.port}): {error}") from None
        finally:
            connection.close()

    def _connect(self) -> http.client.HTTPSConnection:
        try:
            raw = socket.create_connection((self.address, self.port), timeout=self.timeout)
        except OSError as error:
            raise HostUnreachable(f"cannot reach the Proxmox API of host {self.host_name} "
                                  f"({self.address} port {self.port}): {error}") from None
        try:
            tls = self._context().wrap_socket(raw, server_hostname=self.address.split("%")[0])
        except ssl.SSLCertVerificationError as error:
            raw.close()
            raise OrchError(
                f"host {self.host_name}: the Proxmox API's certificate is not trusted "
                f"({error.verify_message}); its SHA-256 fingerprint is "
                f"{_peer_fingerprint(self.address, self.port, self.timeout)}",
                hint="pin it in the inventory: api: {ca_file: pve-root-ca.pem copied from "
                     "the host's /etc/pve} or api: {fingerprint: SHA256} (compare with "
                     "`pvenode cert info` on the host)") from None
        except (OSError, ssl.SSLError) as error:
            raw.close()
            raise HostUnreachable(f"TLS with the Proxmox API of host {self.host_name} "
                                  f"failed: {error}") from None
        if self.fingerprint:
            seen = _sha256_hex(tls.getpeercert(binary_form=True))
            if seen != self.fingerprint:
                tls.close()
                raise OrchError(f"host {self.host_name}: the Proxmox API's certificate has "
                                f"fingerprint {_colons(seen)}, not the pinned {_colons(self.fingerprint)}",
                                hint="a reinstalled host, a renewed certificate, or someone "
                                     "in between: check on the host with `pvenode cert info`")
        connection = http.client.HTTPSConnection(self.address, self.port, timeout=self.timeout)
        connection.sock = tls
        return connection

    def _context(self) -> ssl.SSLContext:
        if self.fingerprint:
            # the pin is the check: the certificate must be exactly this one
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            return context
        return ssl.create_default_context(cafile=self.ca_file)


def _split_url(host_name: str, url: str) -> tuple[str, int]:
    """(address, port) of https://HOST[:PORT]; HOST may be [IPv6%zone], case kept."""
    match = re.fullmatch(r"https://(\[(?P<v6>[^\]]+)\]|(?P<name>[^:/\[\]]+))(:(?P<port>\d+))?/?",
                         str(url))
    if not match:
        raise ConfigError(f"host {host_name}: api url {url!r} must look like "
                          "https://HOST[:PORT] (IPv6 in brackets)")
    return match["v6"] or match["name"], int(match["port"] or 8006)


def _sha256_hex(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest().upper()


def _colons(hex_digest: str) -> str:
    return ":".join(hex_digest[i:i + 2] for i in range(0, len(hex_digest), 2))


def _peer_fingerprint(address: str, port: int, timeout: float) -> str:
    """The fingerprint of what the server presents (for the error message only)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((address, port), timeout=timeout) as raw:
            with context.wrap_socket(raw) as tls:
                return _colons(_sha256_hex(tls.getpeercert(binary_form=True)))
    except OSError:
        return "unknown"


def normalise_fingerprint(text: str) -> Optional[str]:
    """'AA:BB:...' or 'aabb...' (64 hex digits) as upper-case hex, or None if malformed."""
    digits = str(text).replace(":", "").strip().upper()
    return digits if re.fullmatch(r"[0-9A-F]{64}", digits) else None


# ---------------------------------------------------------------- the client
class ProxmoxClient:
    def __init__(self, spec: HostSpec, host: Optional[Transport],
                 warn: Callable[[str], None] = lambda message: None):
        self.spec = spec
        self.warnings: list[str] = []
        self._warn = warn
        self.session = _make_session(spec, host, self._warning)
        serializer = JsonSimpleSerializer() if isinstance(self.session, PveshSession) else _Json()
        self.api = ProxmoxResource(base_url="/api2/json" if isinstance(self.session, HttpsSession)
                                   else "", session=self.session, serializer=serializer)
        self._node: Optional[str] = spec.node

    def _warning(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)
            self._warn(message)

    def node(self) -> str:
        """The node this host is; the inventory's `node:`, else the only node there is."""
        if self._node is None:
            nodes = sorted(item["node"] for item in self._call(lambda: self.api.nodes.get()))
            if len(nodes) != 1:
                raise ConfigError(f"host {self.spec.name} is one of several cluster nodes "
                                  f"({', '.join(nodes)})", hint="set node: in the inventory")
            self._node = nodes[0]
        return self._node

    def containers(self) -> list[dict]:
        items = self._call(lambda: self.api.nodes(self.node()).lxc.get())
        return sorted((typed(item) for item in items), key=lambda item: int(item["vmid"]))

    def cluster_containers(self) -> list[dict]:
        """Every container of the cluster with its node (/cluster/resources)."""
        items = self._call(lambda: self.api.cluster.resources.get(type="vm"))
        return sorted((typed(item) for item in items if item.get("type") == "lxc"),
                      key=lambda item: int(item["vmid"]))

    def status(self, vmid: int) -> dict:
        return typed(self._call(lambda: self.api.nodes(self.node()).lxc(vmid).status.current.get(),
                                vmid))

    def config(self, vmid: int):
        """GET /nodes/NODE/lxc/VMID/config: the CT's configuration as the host keeps it
        (netN: `name=eth0,bridge=vmbr0,hwaddr=...,ip=10.88.1.200/16,type=veth`)."""
        return self._call(lambda: self.api.nodes(self.node()).lxc(vmid).config.get(), vmid)

    def interfaces(self, vmid: int):
        """GET /nodes/NODE/lxc/VMID/interfaces (needs VM.Audit): the CT's interfaces as
        PVE::LXC::get_interfaces reports them, or None for a stopped (or unknown) CT.
        Unchecked data from the host: targets/addresses.py reads it defensively."""
        return self._call(lambda: self.api.nodes(self.node()).lxc(vmid).interfaces.get(), vmid)

    def ensure_running(self, vmid: int, wait_s: float = 60.0, label: Optional[str] = None) -> bool:
        """Start CT vmid unless it runs: follow its start task to the end (its error is raised
        as soon as it fails), then wait until the container runs, all within wait_s.
        Returns False when it was running already, True when this call started it."""
        if self.status(vmid).get("status") == "running":
            return False
        deadline = time.monotonic() + wait_s
        self.start(vmid, wait_s)
        while self.status(vmid).get("status") != "running":
            if time.monotonic() > deadline:
                raise OrchError(f"{label or f'CT {vmid} on host {self.spec.name}'}: its start "
                                f"task ended OK but it does not run after {wait_s:g} s")
            time.sleep(RUNNING_POLL_S)
        return True

    def start(self, vmid: int, wait_s: float = 60.0) -> dict:
        """Start the container and follow its task to the end; returns the task status.
        pvesh waits for the task itself (a slow hookscript included): its call may take
        as long as the start is allowed to."""
        node = self.node()
        started = time.monotonic()
        self.session.timeout = max(API_TIMEOUT, wait_s + 5)
        try:
            upid = self._call(lambda: self.api.nodes(node).lxc(vmid).status.start.post(), vmid)
        finally:
            self.session.timeout = API_TIMEOUT
        if not isinstance(upid, str) or not upid.startswith("UPID:"):
            raise OrchError(f"host {self.spec.name}: starting CT {vmid} returned {upid!r}, "
                            "not a task id")
        return self.wait_task(upid, wait_s, what=f"starting CT {vmid} on host {self.spec.name}",
                              deadline=started + wait_s)

    def wait_task(self, upid: str, wait_s: float, what: str,
                  deadline: Optional[float] = None) -> dict:
        """Poll the task's status until it stops; raise TaskFailed with its error."""
        deadline = deadline if deadline is not None else time.monotonic() + wait_s
        node = self.node()
        while True:
            status = self._call(lambda: self.api.nodes(node).tasks(upid).status.get())
            if status.get("status") == "stopped":
                break
            if time.monotonic() > deadline:
                raise OrchError(f"{what}: task {upid} still runs after {wait_s:g} s",
                                hint="a slow start (a hookscript?): give it more --wait")
            time.sleep(TASK_POLL_S)
        if status.get("exitstatus") != "OK":
            raise TaskFailed(f"{what} failed: {status.get('exitstatus')}"
                             + self._log_tail(node, upid))
        return status

    def _log_tail(self, node: str, upid: str, lines: int = 8) -> str:
        try:
            log = self._call(lambda: self.api.nodes(node).tasks(upid).log.get())
        except OrchError:
            return ""
        text = [item.get("t", "") for item in log if not str(item.get("t", "")).startswith("TASK ")]
        text = [line for line in text if line.strip()][-lines:]
        return ("\n  task log:\n    " + "\n    ".join(text)) if text else ""

    def _call(self, request, vmid: Optional[int] = None):
        try:
            return request()
        except ResourceException as error:
            text = str(error.content or error.status_message).strip()
            if error.status_code == 401:
                token = self.spec.api.get("token_id")
                raise OrchError(f"Proxmox API on host {self.spec.name} refused API token "
                                f"{token}: 401 {text}",
                                hint="check token_id and the secret in "
                                     f"${self.spec.api.get('token_secret_env', SECRET_ENV)}") from None
            if vmid is not None and ("does not exist" in text or error.status_code == 404):
                raise NoSuchContainer(f"CT {vmid} does not exist on host {self.spec.name}: {text}") from None
            raise OrchError(f"Proxmox API on host {self.spec.name} said: {error.status_code} {text}") from None


class _Json:
    """What proxmoxer's ProxmoxResource asks of a serializer, for the HTTPS API's JSON bodies
    ({"data": ...}, errors under "errors"). Not proxmoxer's own https serializer: its module
    imports requests (~35 ms of every `orch ct` command), which orch never uses
    (HttpsSession speaks http.client)."""

    def get_accept_types(self) -> str:
        return "application/json"

    def loads(self, response):
        return _body_field(response, "data")

    def loads_errors(self, response):
        return _body_field(response, "errors")


def _body_field(response, key: str):
    """One field of a JSON object body; a body that is no JSON object is the error itself."""
    try:
        body = json.loads(response.content)   # UTF-8 bytes; a bad byte is a ValueError
    except ValueError:
        body = None
    return body.get(key) if isinstance(body, dict) else {"errors": response.content}


def typed(item: dict) -> dict:
    """Fields as numbers where Proxmox may send strings: `cpus` is the config's text
    ("2", "1.5") when cores or cpulimit are set (PVE::LXC::vmstatus)."""
    item = dict(item)
    for key in ("cpus", "maxcpu", "vmid"):
        value = item.get(key)
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                continue
            item[key] = int(number) if number.is_integer() else number
    return item


SECRET_ENV = "PROXMOX_TOKEN_SECRET"


def api_backend(spec: HostSpec) -> str:
    """'ssh' (pvesh over orch's SSH connection) unless the inventory gives an api url."""
    return str(spec.api.get("backend", "ssh" if "url" not in spec.api else "https"))


def _make_session(spec: HostSpec, host: Optional[Transport], warn):
    backend = api_backend(spec)
    if backend == "ssh":
        if host is None:
            raise ConfigError(f"host {spec.name}: the ssh api backend needs an SSH host")
        return PveshSession(host, warn)
    if backend != "https":
        raise ConfigError(f"host {spec.name}: api backend must be 'ssh' or 'https', not {backend!r}")
    return _https_session(spec)


def _https_session(spec: HostSpec) -> HttpsSession:
    url, token_id = spec.api.get("url"), spec.api.get("token_id")
    secret_env = spec.api.get("token_secret_env", SECRET_ENV)
    if not url or not token_id or "!" not in str(token_id):
        raise ConfigError(f"host {spec.name}: the https api needs url and token_id (USER@REALM!NAME)")
    if spec.api.get("verify_ssl") is False:
        raise ConfigError(f"host {spec.name}: api verify_ssl: false is not supported",
                          hint="pin the certificate instead: api: {ca_file: FILE} or "
                               "api: {fingerprint: SHA256}")
    fingerprint = None
    if spec.api.get("fingerprint"):
        fingerprint = normalise_fingerprint(spec.api["fingerprint"])
        if fingerprint is None:
            raise ConfigError(f"host {spec.name}: api fingerprint must be a SHA-256 "
                              "(64 hex digits, colons allowed)")
    command = invocation.current()
    ca_file = command.expanduser(str(spec.api["ca_file"])) if spec.api.get("ca_file") else None
    if ca_file and not os.path.isfile(ca_file):
        raise ConfigError(f"host {spec.name}: api ca_file {spec.api['ca_file']} does not exist")
    secret = command.env.get(secret_env)
    if not secret:
        raise ConfigError(f"host {spec.name}: the API token secret is not set",
                          hint=f"export {secret_env}=... (orch never reads it from a file or prints it)")
    return HttpsSession(spec.name, str(url), str(token_id), secret,
                        ca_file, fingerprint)
