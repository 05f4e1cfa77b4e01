"""Inventory loading: the documented shape loads; each mistake names file:line:col."""

import textwrap

import pytest

from orchestrator.config.inventory import inventory_path, load_inventory
from orchestrator.ground.errors import ConfigError, ExitCode

GOOD = """\
hosts:
  pve:   {address: 10.1.2.6, user: root}
  here:  {transport: local}
containers:
  drafters: {host: pve, vmid: 200, venv: /root/venv, gpus: [5, 6, 7]}
  dev:      {host: here, venv: ~/.cache/orch/venv}
groups:
  all-drafters: [drafters]
"""


def write(tmp_path, text):
    path = tmp_path / "inventory.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_issue_shape_loads(tmp_path):
    inventory = load_inventory(write(tmp_path, GOOD))
    assert inventory.hosts["pve"].address == "10.1.2.6"
    assert inventory.hosts["here"].transport == "local"
    drafters = inventory.containers["drafters"]
    assert (drafters.host, drafters.vmid, drafters.venv, drafters.gpus) == ("pve", 200, "/root/venv", [5, 6, 7])
    assert [c.name for c in inventory.resolve(["all-drafters"])] == ["drafters"]


def test_committed_inventory_describes_the_user_setup():
    inventory = load_inventory("inventory.yaml")
    assert inventory.hosts["pve"].address == "10.1.2.6"
    drafters = inventory.containers["drafters"]
    assert (drafters.vmid, drafters.venv, drafters.gpus) == (200, "/root/venv", [5, 6, 7])
    assert inventory.hosts[inventory.containers["dev"].host].transport == "local"


def test_resolve_host_vmid_and_dedupe(tmp_path):
    inventory = load_inventory(write(tmp_path, GOOD))
    specs = inventory.resolve(["drafters", "all-drafters", "pve:201", "pve"])
    assert [(s.name, s.host, s.vmid) for s in specs] == [
        ("drafters", "pve", 200), ("pve:201", "pve", 201), ("pve", "pve", None)]


@pytest.mark.parametrize("text, where, words", [
    ("hosts:\n  pve: {adress: 1.2.3.4}\n", ":2:9", "did you mean 'address'"),
    ("hosts:\n  pve: {address: 1.2.3.4, port: 'x'}\n", ":2:33", "port must be an integer"),
    ("hosts:\n  pve: {address: 1.2.3.4, port: 70000}\n", ":2:33", "out of range"),
    ("hosts:\n  pve: {user: root}\n", ":2:8", "needs an address"),
    ("hosts:\n  pve: {address: a}\ncontainers:\n  c: {host: nope, vmid: 200}\n", ":4:13", "not in hosts"),
    ("hosts:\n  pve: {address: a}\ncontainers:\n  c: {host: pve, vmid: 42}\n", ":4:24", "not a valid Proxmox id"),
    ("hosts:\n  pve: {address: a}\ncontainers:\n  c: {host: pve, gpus: [a]}\n", ":4:25", "must be an integer"),
    ("hosts:\n  pve: {address: a}\ngroups:\n  g: [nothing]\n", ":4:7", "no container, group or host"),
    ("hosts:\n  pve: {address: a}\n  pve: {address: b}\n", ":3:3", "duplicate key 'pve'"),
    ("hosts: [\n", ":2:1", "invalid YAML"),
    ("hostz: {}\n", ":1:1", "did you mean 'hosts'"),
    ("hosts:\n  pve: {address: a, transport: telnet}\n", ":2:32", "transport must be"),
    ("hosts:\n  here: {transport: local}\ncontainers:\n  c: {host: here, vmid: 200}\n", ":4:25", "is local"),
    ("hosts:\n  pve: {address: a}\ndefault_target: x\n", ":3:17", "names no container"),
    ("hosts:\n  pve: {address: a}\ncontainers:\n  c: {host: pve, address: 10.1.2.300}\n",
     ":4:27", "address '10.1.2.300' is not an IP address or a host name"),
    ("hosts:\n  pve: {address: a}\ncontainers:\n  c: {host: pve, address: 'a b'}\n",
     ":4:27", "is not an IP address or a host name"),
    ("hosts:\n  pve: {address: a}\ncontainers:\n  c: {host: pve, address: [1]}\n",
     ":4:27", "address must be a string"),
])
def test_mistakes_name_file_line_col(tmp_path, text, where, words):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_inventory(path)
    message = str(caught.value)
    assert message.startswith(path + where), message
    assert words in message
    assert caught.value.exit_code == ExitCode.USAGE


def test_a_container_address_is_an_ip_literal_or_a_host_name(tmp_path):
    text = ("hosts:\n  pve: {address: a}\ncontainers:\n"
            "  a: {host: pve, vmid: 200, address: 10.88.1.200}\n"
            "  b: {host: pve, vmid: 201, address: 'fd00::5'}\n"
            "  c: {host: pve, vmid: 202, address: node-3.lab.example}\n"
            "  d: {host: pve, vmid: 203}\n")
    containers = load_inventory(write(tmp_path, text)).containers
    assert [containers[n].address for n in "abcd"] == [
        "10.88.1.200", "fd00::5", "node-3.lab.example", None]


@pytest.mark.parametrize("name", ["pve:200\n", "pve:201\n", "pve\n"])
def test_a_target_with_a_trailing_newline_is_no_target(tmp_path, name):
    """`$` matches before a final newline: `pve:200\n` once resolved, as a target whose name
    (and so its records and messages) held a newline."""
    inventory = load_inventory(write(tmp_path, GOOD))
    with pytest.raises(ConfigError, match="unknown target"):
        inventory.resolve([name])


@pytest.mark.parametrize("text", [
    "hosts:\n  pve: {address: a}\ncontainers:\n  c: {host: pve, vmid: \"200\\n\"}\n",
    "hosts:\n  pve: {address: a}\ncontainers:\n  c: {host: pve, address: \"a.example\\n\"}\n",
    "hosts:\n  \"pve\\n\": {address: a}\n",
])
def test_a_trailing_newline_in_an_inventory_value_is_refused(tmp_path, text):
    with pytest.raises(ConfigError):
        load_inventory(write(tmp_path, text))


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_inventory(str(tmp_path / "absent.yaml"))


def test_unknown_target_lists_known_ones(tmp_path):
    inventory = load_inventory(write(tmp_path, GOOD))
    with pytest.raises(ConfigError, match="known targets: dev, drafters"):
        inventory.resolve(["nope"])


def test_inventory_path_order(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_INVENTORY", "/x/inv.yaml")
    assert inventory_path(None) == "/x/inv.yaml"
    assert inventory_path("mine.yaml") == "mine.yaml"
    monkeypatch.setenv("ORCH_SANDBOX_DIR", "/sb")
    assert inventory_path("sandbox") == "/sb/inventory.yaml"


CLUSTER = """\
hosts:
  pve1: {address: 10.1.2.6}
  pve2: {address: 10.1.2.7, node: pve-b}
clusters:
  lab: [pve1, pve2]
containers:
  trainer: {cluster: lab, vmid: 300, venv: /root/venv}
"""


def test_clusters_and_containers_named_by_cluster(tmp_path):
    inventory = load_inventory(write(tmp_path, CLUSTER))
    assert inventory.clusters == {"lab": ["pve1", "pve2"]}
    trainer = inventory.containers["trainer"]
    assert (trainer.cluster, trainer.vmid, trainer.venv, trainer.host) == ("lab", 300, "/root/venv", "")
    [by_vmid] = inventory.resolve(["lab:201"])
    assert (by_vmid.cluster, by_vmid.vmid) == ("lab", 201)
    with pytest.raises(ConfigError, match="lab is a cluster; name a container of it as lab:VMID"):
        inventory.resolve(["lab"])


@pytest.mark.parametrize("change, message", [
    (("lab: [pve1, pve2]", "lab: [pve1, nope]"), r":5:\d+: cluster 'lab' names 'nope', which is not in hosts"),
    (("trainer: {cluster: lab,", "trainer: {cluster: other,"), r":7:\d+: container 'trainer' is in cluster 'other'"),
    (("trainer: {cluster: lab, vmid: 300,", "trainer: {cluster: lab,"), r":7:\d+: .*vmid"),
    (("trainer: {cluster: lab,", "trainer: {host: pve1, cluster: lab,"), r":7:\d+: container 'trainer': give host or cluster, not both"),
])
def test_cluster_mistakes_name_file_and_line(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        load_inventory(write(tmp_path, CLUSTER.replace(*change)))


def test_api_pins_are_inventory_keys(tmp_path):
    text = CLUSTER.replace("pve1: {address: 10.1.2.6}",
                        "pve1: {address: 10.1.2.6, api: {url: 'https://pve1:8006', token_id: "
                        "'root@pam!orch', ca_file: /etc/orch/pve-root-ca.pem, "
                        "fingerprint: 'AB:CD'}}")
    assert load_inventory(write(tmp_path, text)).hosts["pve1"].api["ca_file"] == "/etc/orch/pve-root-ca.pem"


# clusters: and groups: are both named lists of names, checked by one helper: each of its
# messages, for each section, still names the place.
@pytest.mark.parametrize("text, change, message", [
    (CLUSTER, ("lab: [pve1, pve2]", "pve1: [pve2]"), r":5:\d+: cluster 'pve1' has the name of a host"),
    (CLUSTER, ("lab: [pve1, pve2]", "lab: pve1"), r":5:\d+: cluster 'lab'"),
    (CLUSTER, ("lab: [pve1, pve2]", "lab: []"), r":5:\d+: cluster 'lab' names no host"),
    (CLUSTER, ("lab: [pve1, pve2]", "lab: [pve1, 7]"), r":5:\d+: "),
    (CLUSTER, ("pve2: {address: 10.1.2.7, node: pve-b}", "pve2: {transport: local}"),
     r":5:\d+: host 'pve2' is local: it cannot be a cluster node"),
    (GOOD, ("all-drafters: [drafters]", "drafters: [dev]"), r":8:\d+: group 'drafters' has the name of a container"),
    (GOOD, ("all-drafters: [drafters]", "all-drafters: drafters"), r":8:\d+: group 'all-drafters'"),
    (GOOD, ("all-drafters: [drafters]", "all-drafters: [drafters, nope]"),
     r":8:\d+: group 'all-drafters' names 'nope', which is no container, group or host"),
])
def test_clusters_and_groups_mistakes_name_their_place(tmp_path, text, change, message):
    assert change[0] in text
    with pytest.raises(ConfigError, match=message):
        load_inventory(write(tmp_path, text.replace(*change)))


def test_groups_may_name_groups_hosts_and_containers(tmp_path):
    text = GOOD + "  everything: [all-drafters, pve, dev]\n"
    assert load_inventory(write(tmp_path, text)).groups["everything"] == ["all-drafters", "pve", "dev"]


def test_yaml_is_read_by_libyaml_and_its_mistakes_said_by_pyyaml(tmp_path, monkeypatch):
    """The fast parser reads (same positions); a mistake is said in the pure-Python parser's
    words, which name the character or the alias (libyaml's do not)."""
    import yaml
    from orchestrator.config import yamlsrc
    composed = []
    real = yaml.compose
    monkeypatch.setattr(yaml, "compose", lambda text, Loader: composed.append(Loader) or real(text, Loader=Loader))
    source = yamlsrc.load_yaml("x.yaml", "a:\n  b: [1, 2]\n")
    assert composed == [yamlsrc.FAST_COMPOSER] and source.where(("a", "b", 1)) == "x.yaml:2:10"
    assert getattr(yaml, "CSafeLoader", None) in (None, yamlsrc.FAST_COMPOSER)
    with pytest.raises(ConfigError, match=r"x.yaml:2:1: invalid YAML: found character '\\t' that cannot start any token"):
        yamlsrc.load_yaml("x.yaml", "a:\n\t- b\n")
    with pytest.raises(ConfigError, match=r"x.yaml:2:4: invalid YAML: found undefined alias 'y'"):
        yamlsrc.load_yaml("x.yaml", "a: &x 1\nb: *y\n")


def test_defaults_jobs_sets_a_fan_outs_concurrency(tmp_path):
    assert load_inventory(write(tmp_path, GOOD)).jobs == 32   # config/concurrency.py
    assert load_inventory(write(tmp_path, GOOD + "defaults: {jobs: 8}\n")).jobs == 8


@pytest.mark.parametrize("defaults, words", [
    ("{jobs: 0}", "jobs must be between 1 and 1000, not 0"),
    ("{jobs: many}", "'many'"),
    ("{job: 4}", "unknown key 'job' in defaults"),
    ("[4]", "defaults"),
])
def test_bad_defaults_are_named_with_their_line(tmp_path, defaults, words):
    with pytest.raises(ConfigError) as raised:
        load_inventory(write(tmp_path, GOOD + f"defaults: {defaults}\n"))
    assert words in str(raised.value) and "inventory.yaml:9" in str(raised.value), str(raised.value)
