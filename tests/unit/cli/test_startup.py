"""orch starts quickly: `--version`, `--help` and every `CMD --help` import no SSH, no jinja2,
no playbook or monitor code, and the thin client that hands commands to the agent imports
neither click nor paramiko (docs/guide/agent.md); the direct path (`--no-agent`) of the quick
commands imports no requests, no invoke, and no Proxmox API where none is asked
(docs/design/transport.md). Measured with sys.modules in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest

from orchestrator.cli import app as cli
from orchestrator.agent.client import is_fast_command
from orchestrator.ground import commands

# Never for start-up or help: these are what made every command cost 0.3-0.6 s.
HEAVY = ("paramiko", "invoke", "fabric", "jinja2", "proxmoxer", "requests", "yaml", "mcp",
         "orchestrator.targets.fleet", "orchestrator.remote.ssh", "orchestrator.targets.proxmox",
         "orchestrator.watch.monitor", "orchestrator.playbook", "orchestrator.playbook.engine",
         "orchestrator.playbook.attach", "orchestrator.nightly.rerun", "orchestrator.playbook.steps", "orchestrator.agentd")
# Everything outside the standard library `orch --version` and `orch --help` may import.
STARTUP_THIRD_PARTY = {"__main__", "click", "rich", "pygments", "markdown_it", "mdurl", "orchestrator",
                       "_distutils_hack"}

PROBE = """
import json, sys
sys.argv = ["orch", *json.loads(sys.argv[1])]
try:
    from orchestrator.cli.main import main
    main()
except SystemExit:
    pass
sys.stderr.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n")
"""


def modules_after(*args: str, env: dict | None = None) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(list(args))],
                         capture_output=True, text=True, timeout=60, env=env)
    line = next(line for line in out.stderr.splitlines() if line.startswith("MODULES "))
    return set(json.loads(line[len("MODULES "):]))


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def third_party(modules: set[str]) -> set[str]:
    tops = {m.split(".")[0] for m in modules}
    return {t for t in tops if t not in sys.stdlib_module_names and not t.startswith("__editable__")}


@pytest.mark.parametrize("args", [["--version"], ["--help"], []])
def test_version_and_help_import_only_click_and_rich(args):
    modules = modules_after(*args)
    assert heavy(modules) == []
    assert third_party(modules) <= STARTUP_THIRD_PARTY, third_party(modules) - STARTUP_THIRD_PARTY


def _every_command_path():
    paths = []
    for name in commands.BY_NAME:
        command = cli.load_command(name)
        if command is None:
            continue
        paths.append([name])
        if isinstance(command, click.Group):
            paths.extend([name, sub] for sub in command.commands)
    return paths


@pytest.mark.parametrize("path", _every_command_path(), ids=" ".join)
def test_every_command_help_imports_nothing_heavy(path):
    assert heavy(modules_after(*path, "--help")) == []


def test_the_thin_client_imports_neither_click_nor_paramiko():
    # nor the direct path's early connection (its threading and files cost a warm command ~2 ms)
    probe = ("import sys; from orchestrator.cli import main; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('click', 'paramiko', 'rich', 'yaml', 'typing', 'threading') "
             "or m == 'orchestrator.remote.early'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_help_table_says_what_each_command_says():
    """`orch --help` reads each command's docstring from its source without importing it:
    what it shows must be what the loaded command says."""
    for name in commands.BY_NAME:
        command = cli.load_command(name)
        if command is None:
            continue
        stand_in = click.Command(name, help=cli.own_help(name))
        assert stand_in.get_short_help_str(1000) == command.get_short_help_str(1000), name


def test_help_lists_every_command_without_loading_it():
    listing = subprocess.run([sys.executable, "-m", "orchestrator", "--help"], capture_output=True,
                             text=True, timeout=60).stdout
    listed = [line.split()[0] for line in listing.split("Commands:\n")[1].splitlines()]
    expected = sorted(n for n in commands.BY_NAME if cli.load_command(n) is not None)
    assert listed == expected


@pytest.mark.parametrize("args, fast", [
    (["exec", "ct", "--", "true"], True),
    (["-i", "inv.yaml", "exec", "ct", "true"], True),
    (["--inventory=inv.yaml", "grep-torch", "x"], True),
    (["-iinv.yaml", "grep-pkg", "triton", "x"], True),
    (["inventory", "check"], True),
    (["ct", "list"], True),
    (["ct", "status", "x"], True),
    (["ct", "start", "x"], False),
    (["patch", "fx-tls", "status"], True),
    (["patch", "fx-tls", "-t", "apply", "diff"], True),
    (["patch", "fx-tls", "apply"], False),
    (["patch", "fx-tls", "--target", "diff", "revert"], False),
    (["verify", "fx-race"], True),
    (["cp", "-r", "./configs", "ct:/root/app/"], True),
    (["cp", "--help"], False),
    (["--no-agent", "exec", "ct", "true"], False),
    (["--trust-new-host-keys", "exec", "ct", "true"], False),
    (["--help"], False),
    (["inventory", "check", "--help"], False),     # the agent would print it to its own stdout
    (["exec", "-h"], False),
    (["exec", "ct", "--", "grep", "-h", "x"], True),   # the remote grep's -h
    (["run", "playbook.yaml"], False),
    (["nightly", "playbook.yaml"], False),
    ([], False),
])
def test_which_commands_go_to_the_agent(args, fast):
    assert is_fast_command(args) is fast


# ---------------------------------------------------------------- the direct path
# What `orch --no-agent exec` and the other quick commands must not import: requests and
# proxmoxer's https backend (no command here talks to the HTTPS API), proxmoxer itself where
# no Proxmox API is asked, and invoke (paramiko.config's import, for ssh_config `Match exec`
# only). Together they were ~100 ms of a 330 ms `orch --no-agent exec`. And importlib.metadata
# (paramiko's __version__: email, zipfile, csv, ... about 7 ms).
NOT_FOR_THE_DIRECT_PATH = ("requests", "urllib3", "invoke", "proxmoxer.backends.https",
                           "importlib.metadata")
NOT_WITHOUT_THE_API = NOT_FOR_THE_DIRECT_PATH + ("proxmoxer", "orchestrator.targets.proxmox")

DIRECT_INVENTORY = """\
hosts:
  here: {transport: local}
  far: {address: 127.0.0.1, port: 1, connect_timeout: 2}
containers:
  dev: {host: here}
  ct: {host: far, vmid: 200}
"""
# A stand-in invoke on PYTHONPATH: the test holds whether or not the real one is installed.
FAKE_INVOKE = '''\
import os
class _Ran:
    ok = True
def run(command, **kwargs):
    with open(os.environ["FAKE_INVOKE_LOG"], "a") as log:
        log.write(command + "\\n")
    return _Ran()
'''


@pytest.fixture
def direct_env(tmp_path):
    (tmp_path / "invoke").mkdir()
    (tmp_path / "invoke" / "__init__.py").write_text(FAKE_INVOKE)
    (tmp_path / "inventory.yaml").write_text(DIRECT_INVENTORY)
    (tmp_path / "home").mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HOME": str(tmp_path / "home"),
           "ORCH_AGENT": "off", "FAKE_INVOKE_LOG": str(tmp_path / "invoke.log")}
    return env, str(tmp_path / "inventory.yaml")


def loaded(modules: set[str], names) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


@pytest.mark.parametrize("args", [
    ["exec", "dev", "--", "true"],                 # a local target: no SSH at all
    ["exec", "ct", "--", "true"],                  # an SSH host (unreachable: connect refused)
    ["grep-torch", "-t", "ct", "x"],
    ["grep-pkg", "-t", "ct", "triton", "x"],
    ["patch", "fx-tls", "status", "-t", "ct"],
], ids=" ".join)
def test_the_direct_path_imports_no_proxmox_api_and_no_invoke(direct_env, args):
    env, inventory = direct_env
    modules = modules_after("--no-agent", "-i", inventory, *args, env=env)
    assert "orchestrator.targets.fleet" in modules       # it did reach the hosts' code
    assert loaded(modules, NOT_WITHOUT_THE_API) == []


def test_ct_list_imports_the_api_but_not_requests_or_invoke(direct_env):
    env, inventory = direct_env
    modules = modules_after("--no-agent", "-i", inventory, "ct", "list", "far", env=env)
    assert "orchestrator.targets.proxmox" in modules
    assert loaded(modules, NOT_FOR_THE_DIRECT_PATH) == []


MATCH_EXEC_PROBE = """
import json, sys
from orchestrator.remote.paramiko_lib import paramiko
before = "invoke" in sys.modules
config = paramiko.SSHConfig.from_text('Match exec "test -n x"\\n  User bob\\n')
user = config.lookup("somehost").get("user")
import invoke   # as Fabric does, later in the same process
print(json.dumps({"before": before, "user": user, "invoke": invoke.__file__,
                  "paramiko_uses": paramiko.config.invoke.run is invoke.run}))
"""


def test_paramiko_without_invoke_still_runs_match_exec_and_leaves_invoke_to_fabric(direct_env,
                                                                                   tmp_path):
    env, _ = direct_env
    out = subprocess.run([sys.executable, "-c", MATCH_EXEC_PROBE], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen == {"before": False, "user": "bob", "invoke": str(tmp_path / "invoke" / "__init__.py"),
                    "paramiko_uses": True}
    # paramiko's lookup may run a `Match exec` more than once (its final pass)
    assert set((tmp_path / "invoke.log").read_text().splitlines()) == {"test -n x"}


def test_a_quiet_exec_imports_no_rich(direct_env):
    """The command's output is its own bytes: rich loads only when orch prints a message."""
    env, inventory = direct_env
    modules = modules_after("--no-agent", "-i", inventory, "exec", "dev", "--", "true", env=env)
    assert "orchestrator.remote.container" in modules
    assert loaded(modules, ["rich"]) == []
    failed = modules_after("--no-agent", "-i", inventory, "exec", "nosuch", "--", "true", env=env)
    assert "rich.console" in failed   # the error message went through it


VERSION_PROBE = """
import json, sys
from orchestrator.remote.paramiko_lib import paramiko
held_off = "importlib.metadata" not in sys.modules
from importlib import metadata
print(json.dumps({"held_off": held_off, "ours": paramiko.__version__,
                  "metadata": metadata.version("paramiko"), "module": type(metadata).__name__}))
"""


def test_paramikos_version_is_read_without_importlib_metadata():
    out = subprocess.run([sys.executable, "-c", VERSION_PROBE], capture_output=True, text=True,
                         timeout=60)
    seen = json.loads(out.stdout)
    # the same version as importlib.metadata says, and the real module for everyone after
    assert seen == {"held_off": True, "ours": seen["metadata"], "metadata": seen["metadata"],
                    "module": "module"}


def test_the_version_stand_in_leaves_other_layouts_to_importlib_metadata(tmp_path, monkeypatch):
    from orchestrator.remote.paramiko_lib import _PackageVersions
    for name, folders in (("twice", ["twice-1.0.dist-info", "twice-2.0.dist-info"]),
                          ("none", []), ("once", ["once-3.1.dist-info"])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
        for folder in folders:
            (tmp_path / folder).mkdir()
            (tmp_path / folder / "METADATA").write_text(f"Name: {name}\nVersion: {folder.split('-')[1][:3]}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    versions = _PackageVersions("importlib.metadata")
    assert versions.version("once") == "3.1"
    import importlib.metadata
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        versions.version("none")   # what importlib.metadata itself says
    assert versions.version("twice") == importlib.metadata.version("twice")
    assert versions.distributions is importlib.metadata.distributions
