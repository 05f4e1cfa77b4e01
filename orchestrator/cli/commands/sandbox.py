"""`orch sandbox up | down | status | build-root`: the Proxmox-like sandbox on this machine.

The sandbox itself is the separate `orch_sandbox` distribution (sandbox/ in a clone of the
repository), never part of the orch wheel. These commands use it when it is installed and
otherwise exit with SANDBOX_NOT_INSTALLED_EXIT and a sentence saying how to get it."""

from __future__ import annotations

import functools
import json
import time

import click

from orchestrator.ground.errors import ExitCode, OrchError

STATE_DIR_HELP = "State directory (default /var/lib/orch-sandbox, or $ORCH_SANDBOX_DIR)."


SANDBOX_NOT_INSTALLED_EXIT = ExitCode.USAGE   # as for a machine the sandbox cannot run on


class SandboxNotInstalled(OrchError):
    exit_code = SANDBOX_NOT_INSTALLED_EXIT


NOT_INSTALLED_TEXT = (
    "the sandbox is not installed. It is orch's test bed: Proxmox-like hosts on this machine "
    "(a real OpenSSH server and real LXC containers, with emulated pct, pvesh and the Proxmox "
    "API), used by orch's integration tests and for trying playbooks without a Proxmox host. "
    "It is not part of the orch package; it ships as a separate distribution in orch's "
    "source repository. To get it, clone the repository and, in the clone, run "
    "`pip install -e . -e ./sandbox` (or, as root on Debian, `bash scripts/setup.sh`, which "
    "also installs the system packages it needs: LXC, an OpenSSH server; see docs/design/sandbox.md).")


def sandbox_package():
    """The installed orch_sandbox package, or SandboxNotInstalled saying how to get it."""
    try:
        import orch_sandbox  # optional distribution, not in the orch wheel: only these commands need it
    except ModuleNotFoundError as error:
        if error.name != "orch_sandbox":
            raise
        raise SandboxNotInstalled(NOT_INSTALLED_TEXT) from None
    return orch_sandbox


def reports_errors(command):
    """Print an OrchError as its sentence (no traceback) and exit with its code."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except OrchError as error:
            click.echo(f"error: {error}", err=True)
            return error.exit_code
    return wrapper


@click.group("sandbox")
def sandbox():
    """A Proxmox-like test bed on this machine: hosts with real sshd and LXC containers.

    Each host is a network namespace with its own OpenSSH server, real LXC containers,
    and emulated `pct` and `pvesh`. Needs root and the packages in .ci/apt-packages.txt.

    \b
    Example:
      sudo orch sandbox up
      orch -i /var/lib/orch-sandbox/inventory.yaml exec sb1-200 -- python3 -V
      ssh -F /var/lib/orch-sandbox/ssh_config sb1 "pct exec 200 -- hostname"
      sudo orch sandbox down

    The sandbox is a separate distribution, installed from a clone of orch's repository:
    `pip install -e . -e ./sandbox` (scripts/setup.sh does it). Without it every sandbox
    command says so and exits with code 2.
    """


@sandbox.command("up")
@click.option("--hosts", "hosts_count", default=2, show_default=True, type=int,
              help="Number of hosts (sb1, sb2, ...).")
@click.option("--containers", "containers_count", default=3, show_default=True, type=int,
              help="Containers per host, VMIDs 200, 201, ...")
@click.option("--stopped", default=1, show_default=True, type=int,
              help="How many of them (the last ones) are created but left stopped.")
@click.option("--real-root", "real_root", default="", metavar="VMIDS",
              callback=lambda ctx, param, value: _vmid_list(value),
              help="Comma-separated VMIDs (on every host) that get a real distribution root "
                   "of their own instead of this machine's /usr and /etc.")
@click.option("--root-distro", "distribution", default="debian-12", show_default=True,
              type=click.Choice(["debian-12", "debian-11"]),
              help="The distribution of the --real-root containers.")
@click.option("--cluster", default=None, metavar="NAME",
              help="Make the hosts one Proxmox cluster NAME: one shared /etc/pve, vmids "
                   "unique cluster-wide (host N has N00, N01, ...). Down first to switch.")
@click.option("--state-dir", default=None, help=STATE_DIR_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@reports_errors
def up_command(hosts_count, containers_count, stopped, real_root, distribution, cluster,
               state_dir, as_json):
    """Create the sandbox, or repair and reuse the one that is there (idempotent).

    Containers share this machine's /usr and /etc (read-only; they start in milliseconds)
    unless --real-root names them: those run on a real Debian 12 root of their own
    (mmdebstrap, minbase, python3 and systemd-sysv only; systemd is PID 1; no network
    device but loopback). The root is built once from this machine's apt sources (about
    30 s) and cached under ~/.cache/orch/sandbox-roots; later ups unpack it in seconds.

    \b
    Example:
      sudo orch sandbox up                 # sb1, sb2; CTs 200, 201 running, 202 stopped
      sudo orch sandbox up --hosts 3 --containers 2 --stopped 0
      sudo orch sandbox up --containers 4 --stopped 1 --real-root 202   # CT 202: Debian 12
      sudo orch sandbox up --cluster lab   # sb1 (CTs 200..), sb2 (CTs 300..) as one cluster
    """
    sb = sandbox_package()
    started = time.monotonic()
    handle = sb.up(hosts_count, containers_count, stopped, state_dir=state_dir,
                   real_root=real_root, distribution=distribution, cluster=cluster,
                   progress=lambda text: click.echo(f"  {text}", err=True))
    elapsed = time.monotonic() - started
    if as_json:
        click.echo(json.dumps({"seconds": round(elapsed, 3), **sb.status(state_dir)}, indent=2))
        return
    click.echo(f"sandbox up in {elapsed:.2f} s: {', '.join(handle.host_names)}")
    click.echo(f"  inventory   {handle.inventory_path}")
    click.echo(f"  ssh_config  {handle.ssh_config}   "
               f"(ssh -F {handle.ssh_config} {handle.host_names[0]} 'pct list')")
    for item in sb.recommended_missing():
        click.echo(f"  note: {item}", err=True)


def _vmid_list(text: str) -> tuple[int, ...]:
    words = [word.strip() for word in (text or "").split(",") if word.strip()]
    bad = [word for word in words if not word.isdigit()]
    if bad:
        raise click.BadParameter(f"{', '.join(bad)}: expected VMIDs like 202 or 200,202")
    return tuple(int(word) for word in words)


@sandbox.command("build-root")
@click.option("--distro", "distribution", default="debian-12", show_default=True,
              type=click.Choice(["debian-12", "debian-11"]), help="Which distribution.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@reports_errors
def build_root_command(distribution, as_json):
    """Build (once) and cache the real container root that `up --real-root` uses.

    mmdebstrap builds it from this machine's apt sources into
    ~/.cache/orch/sandbox-roots (or $ORCH_ROOT_CACHE); a cached root is reused.

    \b
    Example:
      sudo orch sandbox build-root
    """
    roots = sandbox_package().roots
    started = time.monotonic()
    built_before = roots.tarball_path(distribution).is_file()
    tarball = roots.ensure_tarball(distribution,
                                   progress=lambda text: click.echo(text, err=True))
    elapsed = time.monotonic() - started
    result = {"distribution": distribution, "tarball": str(tarball),
              "bytes": tarball.stat().st_size, "cached": built_before,
              "seconds": round(elapsed, 3)}
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    how = "cached" if built_before else f"built in {elapsed:.1f} s"
    click.echo(f"{distribution} root {how}: {tarball} ({result['bytes'] / 1e6:.0f} MB)")


@sandbox.command("down")
@click.option("--purge", is_flag=True,
              help="Also delete the state directory (SSH keys, logs).")
@click.option("--state-dir", default=None, help=STATE_DIR_HELP)
@reports_errors
def down_command(purge, state_dir):
    """Remove the sandbox: processes, containers, namespaces, veths, cgroups, files.

    Keeps the SSH keys (known_hosts stays valid for the next up) and the logs in the
    state directory, unless --purge.

    \b
    Example:
      sudo orch sandbox down
      sudo orch sandbox down --purge
    """
    sb = sandbox_package()
    started = time.monotonic()
    removed = sb.down(purge=purge, state_dir=state_dir)
    elapsed = time.monotonic() - started
    what = ", ".join(removed) if removed else "nothing was up"
    click.echo(f"sandbox down in {elapsed:.2f} s ({what})")


@sandbox.command("status")
@click.option("--state-dir", default=None, help=STATE_DIR_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@reports_errors
def status_command(state_dir, as_json):
    """Show the hosts, their sshd and containers. Exit 0 when all is as `up` made it,
    1 when the sandbox is down or something differs, 2 when it cannot run here.

    \b
    Example:
      orch sandbox status
      orch sandbox status --json | jq '.hosts[].containers'
    """
    report = sandbox_package().status(state_dir)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(format_status(report))
    return 0 if report["healthy"] else 1


def format_status(report: dict) -> str:
    if not report["hosts"]:
        return f"sandbox: down (state directory {report['state_dir']})"
    word = "up" if report["healthy"] else ("up, degraded" if report["up"] else "broken")
    lines = [f"sandbox: {word} (inventory {report['inventory']})"]
    for host in report["hosts"]:
        sshd = f"sshd pid {host['sshd_pid']}" if host["sshd_pid"] else "sshd DOWN"
        if host["sshd_pid"] and not host["ssh_port_open"]:
            sshd += " (port 22 unreachable)"
        link = "" if host["link_up"] else ", link DOWN"
        lines.append(f"  {host['name']:<6} {host['address']:<18} {sshd}{link}")
        for ct in host["containers"]:
            note = "" if ct["state"] == ct["expected"] else f" (up makes it {ct['expected']})"
            root = "" if ct.get("root", "host") == "host" else f"  ({ct['root']} root)"
            address = f"  {ct['address']}" if ct.get("address") else ""
            lines.append(f"      CT {ct['vmid']}  {ct['state']:<7}{address}{note}{root}")
    return "\n".join(lines)
