"""The Proxmox API through proxmoxer: container list, status and start.

Two ways in, chosen per host in the inventory (`api:`):
- backend "ssh" (default): proxmoxer's command backend runs `pvesh ... --output-format json`
  on the host, through orch's own SSH connection (host keys checked; proxmoxer's own SSH
  backends accept unknown keys silently, so they are not used).
- backend "https": the HTTPS API with an API token whose secret is read from the environment
  variable the inventory names (never from the file, never printed).
"""

from __future__ import annotations

import os
from typing import Optional

from proxmoxer import ProxmoxAPI, ResourceException
from proxmoxer.backends.command_base import CommandBaseSession, JsonSimpleSerializer
from proxmoxer.core import ProxmoxResource

from orchestrator.config.inventory import HostSpec
from orchestrator.errors import ConfigError, NoSuchContainer, OrchError
from orchestrator.remote.base import Transport

API_TIMEOUT = 30.0


class _PveshSession(CommandBaseSession):
    """proxmoxer's command backend, but every pvesh call goes through orch's transport."""

    def __init__(self, host: Transport):
        super().__init__(service="PVE", timeout=API_TIMEOUT)
        self.host = host

    def _exec(self, cmd):
        result = self.host.run([str(part) for part in cmd], timeout=self.timeout)
        return result.text, result.error_text, result.exit_code


class ProxmoxClient:
    def __init__(self, spec: HostSpec, host: Transport):
        self.spec = spec
        self.api = _make_api(spec, host)
        self._node: Optional[str] = spec.node

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
        return sorted(items, key=lambda item: int(item["vmid"]))

    def status(self, vmid: int) -> dict:
        return self._call(lambda: self.api.nodes(self.node()).lxc(vmid).status.current.get(), vmid)

    def start(self, vmid: int):
        return self._call(lambda: self.api.nodes(self.node()).lxc(vmid).status.start.post(), vmid)

    def _call(self, request, vmid: Optional[int] = None):
        try:
            return request()
        except ResourceException as error:
            text = f"{error.status_message} {error.content}".strip()
            if vmid is not None and ("does not exist" in text or error.status_code == 404):
                raise NoSuchContainer(f"CT {vmid} does not exist on host {self.spec.name}: {text}") from None
            raise OrchError(f"Proxmox API on host {self.spec.name} said: {text}") from None


def _make_api(spec: HostSpec, host: Transport):
    backend = spec.api.get("backend", "ssh" if "url" not in spec.api else "https")
    if backend == "ssh":
        return ProxmoxResource(base_url="", session=_PveshSession(host),
                               serializer=JsonSimpleSerializer())
    if backend != "https":
        raise ConfigError(f"host {spec.name}: api backend must be 'ssh' or 'https', not {backend!r}")
    return _https_api(spec)


def _https_api(spec: HostSpec):
    url, token_id = spec.api.get("url"), spec.api.get("token_id")
    secret_env = spec.api.get("token_secret_env", "PROXMOX_TOKEN_SECRET")
    if not url or not token_id or "!" not in str(token_id):
        raise ConfigError(f"host {spec.name}: the https api needs url and token_id (USER@REALM!NAME)")
    secret = os.environ.get(secret_env)
    if not secret:
        raise ConfigError(f"host {spec.name}: the API token secret is not set",
                          hint=f"export {secret_env}=... (orch never reads it from a file or prints it)")
    user, _, token_name = str(token_id).partition("!")
    host = str(url).removeprefix("https://").rstrip("/")
    return ProxmoxAPI(host, user=user, token_name=token_name, token_value=secret,
                      verify_ssl=bool(spec.api.get("verify_ssl", True)), backend="https",
                      timeout=API_TIMEOUT)
