"""How a host's SSH settings are resolved: inventory first, ~/.ssh/config for the rest."""

import textwrap

from orchestrator.config.inventory import load_inventory
from orchestrator.targets.fleet import Fleet

SSH_CONFIG = """\
Host pve-alias
    HostName 192.0.2.10
    User admin
    Port 2222
    IdentityFile ~/.ssh/pve_key
    ProxyJump jumper@bastion.example:2200
    UserKnownHostsFile ~/.ssh/pve_known_hosts
"""


def fleet(tmp_path, hosts_yaml):
    (tmp_path / "ssh_config").write_text(SSH_CONFIG)
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(textwrap.dedent(hosts_yaml))
    return Fleet(load_inventory(str(inventory)), ssh_config_path=str(tmp_path / "ssh_config"))


def test_ssh_config_alias_fills_everything(tmp_path):
    f = fleet(tmp_path, "hosts:\n  pve: {address: pve-alias}\n")
    s = f.ssh_settings(f.inventory.hosts["pve"])
    assert (s.address, s.user, s.port) == ("192.0.2.10", "admin", 2222)
    assert s.identity and s.identity[0].endswith("/.ssh/pve_key")
    assert s.known_hosts.endswith("/.ssh/pve_known_hosts")
    assert (s.jump.address, s.jump.user, s.jump.port) == ("bastion.example", "jumper", 2200)


def test_inventory_values_win_over_ssh_config(tmp_path):
    f = fleet(tmp_path, """\
        hosts:
          bastion: {address: 198.51.100.1, user: ops}
          pve: {address: pve-alias, user: root, port: 22, jump: bastion, known_hosts: /k}
        """)
    s = f.ssh_settings(f.inventory.hosts["pve"])
    assert (s.user, s.port, s.known_hosts) == ("root", 22, "/k")
    assert (s.jump.name, s.jump.address, s.jump.user) == ("bastion", "198.51.100.1", "ops")


def test_plain_address_defaults(tmp_path):
    f = fleet(tmp_path, "hosts:\n  pve: {address: 10.1.2.6}\n")
    s = f.ssh_settings(f.inventory.hosts["pve"])
    assert (s.address, s.user, s.port, s.jump) == ("10.1.2.6", "root", 22, None)
    assert s.known_hosts == "~/.ssh/known_hosts" and s.trust_on_first_use is False
    assert s.known_hosts_name() == "10.1.2.6"


def test_dead_link_detection_from_the_inventory_then_ssh_config_then_defaults(tmp_path):
    (tmp_path / "ssh_config").write_text(SSH_CONFIG + "    ServerAliveInterval 2\n"
                                         "    ServerAliveCountMax 4\n")
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("hosts:\n  a: {address: pve-alias}\n"
                         "  b: {address: pve-alias, alive_interval: 0.5, alive_count_max: 1}\n"
                         "  c: {address: 10.1.2.6}\n")
    f = Fleet(load_inventory(str(inventory)), ssh_config_path=str(tmp_path / "ssh_config"))
    settings = {name: f.ssh_settings(f.inventory.hosts[name]) for name in "abc"}
    assert (settings["a"].alive_interval, settings["a"].alive_count_max) == (2.0, 4)
    assert (settings["b"].alive_interval, settings["b"].alive_count_max) == (0.5, 1)
    assert (settings["c"].alive_interval, settings["c"].alive_count_max) == (5.0, 3)
