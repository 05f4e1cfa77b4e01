"""Emulated Proxmox `pct` for orch's sandbox hosts, every subcommand but `exec`.

The `pct` on PATH is a bash front end: it handles `pct exec` itself (it is on the path of
every command orch runs, and Python's start-up would double its cost) and execs this file
for the rest: list, status, config, start, stop, shutdown, enter, push, pull.
See pvelib.py for how the node's state is read.
"""

import os
import sys

import pvelib
from pvelib import PveError, UsageError, check_vmid, fail, parse_command_line

USAGE = {
    "list": "pct list",
    "status": "pct status <vmid> [OPTIONS]",
    "config": "pct config <vmid> [OPTIONS]",
    "start": "pct start <vmid> [OPTIONS]",
    "stop": "pct stop <vmid> [OPTIONS]",
    "shutdown": "pct shutdown <vmid> [OPTIONS]",
    "exec": "pct exec <vmid> [<extra-args>] [OPTIONS]",   # handled by the bash `pct`
    "enter": "pct enter <vmid> [OPTIONS]",
    "push": "pct push <vmid> <file> <destination> [OPTIONS]",
    "pull": "pct pull <vmid> <path> <destination> [OPTIONS]",
}
FILE_OPTIONS = {"user": "string", "group": "string", "perms": "string"}


def lxc_attach(vmid, keep_env, command):
    """Replace this process with lxc-attach, as pct.pm's exec() does."""
    # pct.pm's clean_environment(): these break TLS inside containers
    os.environ.pop("SSL_CERT_FILE", None)
    os.environ.pop("SSL_CERT_DIR", None)
    argv = ["lxc-attach", "-n", vmid, "--keep-env" if keep_env else "--clear-env"]
    if command:
        argv += ["--", *command]
    sys.stdout.flush()
    os.execvp("lxc-attach", argv)


def cmd_enter(argv):
    params, _ = parse_command_line(argv, ["vmid"], {"keep-env": "boolean"})
    vmid = check_vmid(params["vmid"])
    pvelib.load_config(vmid)
    if not pvelib.is_running(vmid):
        raise PveError(f"container '{vmid}' not running!")
    lxc_attach(vmid, params.get("keep-env", True), [])


def cmd_list(argv):
    parse_command_line(argv, [], {})
    running = pvelib.running_vmids()
    rows = []
    for vmid in pvelib.list_vmids():
        config = pvelib.load_config(vmid)
        name = config.get("hostname") or f"CT{vmid}"
        status = "running" if vmid in running else "stopped"
        rows.append((vmid, status, config.get("lock", ""), name))
    if not rows:
        return  # the real pct list prints nothing at all, not even the header
    line = "%-10s %-10s %-12s %-20s\n"
    sys.stdout.write(line % ("VMID", "Status", "Lock", "Name"))
    for row in rows:
        sys.stdout.write(line % row)


def cmd_status(argv):
    params, _ = parse_command_line(argv, ["vmid"], {"verbose": "boolean"})
    vmid = check_vmid(params["vmid"])
    config = pvelib.load_config(vmid)
    running = pvelib.is_running(vmid)
    if not params.get("verbose"):
        print(f"status: {'running' if running else 'stopped'}")
        return
    status = pvelib.vm_status(vmid, config, running)
    for key in sorted(status):
        if key != "cpu":
            print(f"{key}: {status[key]}")


def cmd_config(argv):
    params, _ = parse_command_line(argv, ["vmid"], {"current": "boolean", "snapshot": "string"})
    config = pvelib.load_config(check_vmid(params["vmid"]))
    for key in sorted(config):
        value = config[key]
        if key == "description":
            value = value.replace("\n", "\\n")  # PVE::Tools::encode_text, roughly
        print(f"{key}: {value}")


def cmd_start(argv):
    params, _ = parse_command_line(argv, ["vmid"], {"skiplock": "boolean", "debug": "boolean"})
    vmid = check_vmid(params["vmid"])
    if pvelib.is_running(vmid):
        raise PveError(f"CT {vmid} already running")
    pvelib.load_config(vmid)
    import pvetasks  # only here: `pct exec`, run for every orch command, imports as little as it can

    # pct start runs the start task in the foreground and dies with its error
    pvetasks.start_container(vmid, lambda text: sys.stdout.write(text.rstrip("\n") + "\n"))


def _running_ct(vmid_param):
    """stop's and shutdown's check, with pct's words: the vmid of a CT that runs."""
    vmid = check_vmid(vmid_param)
    if not pvelib.is_running(vmid):
        raise PveError(f"CT {vmid} not running")
    pvelib.load_config(vmid)
    return vmid


def cmd_stop(argv):
    params, _ = parse_command_line(argv, ["vmid"], {"skiplock": "boolean",
                                                    "overrule-shutdown": "boolean"})
    vmid = _running_ct(params["vmid"])
    pvelib.lxc_command(["lxc-stop", "-n", vmid, "--kill"],
                       f"command 'lxc-stop -n {vmid} --kill' failed: exit code 1")


def cmd_shutdown(argv):
    params, _ = parse_command_line(argv, ["vmid"], {"timeout": "string",
                                                    "forceStop": "boolean"})
    vmid = _running_ct(params["vmid"])
    timeout = params.get("timeout", "60")
    try:
        pvelib.lxc_command(["lxc-stop", "-n", vmid, "--timeout", timeout],
                           f"command 'lxc-stop -n {vmid} --timeout {timeout}' failed")
    except PveError:
        if not params.get("forceStop"):
            raise
        sys.stderr.write("shutdown failed - forcing stop now\n")
        pvelib.lxc_command(["lxc-stop", "-n", vmid, "--kill"],
                           f"command 'lxc-stop -n {vmid} --kill' failed: exit code 1")


def cmd_push(argv):
    params, _ = parse_command_line(argv, ["vmid", "file", "destination"], FILE_OPTIONS)
    vmid = check_vmid(params["vmid"])
    if not pvelib.is_running(vmid):
        raise PveError("can only push files to a running CT")
    pvelib.load_config(vmid)
    import pvefiles  # only push/pull need it (see the note on pvetasks above)

    pvefiles.push(vmid, params["file"], params["destination"], params.get("perms"),
                  params.get("user"), params.get("group"))


def cmd_pull(argv):
    params, _ = parse_command_line(argv, ["vmid", "path", "destination"], FILE_OPTIONS)
    vmid = check_vmid(params["vmid"])
    if not pvelib.is_running(vmid):
        raise PveError(f"can only pull files from a running VM at {pvelib.PCT_SOURCE} line 590.")
    import pvefiles  # only push/pull need it (see the note on pvetasks above)

    pvefiles.pull(vmid, params["path"], params["destination"], params.get("perms"),
                  params.get("user"), params.get("group"))


COMMANDS = {
    "enter": cmd_enter, "list": cmd_list, "status": cmd_status,
    "config": cmd_config, "start": cmd_start, "stop": cmd_stop, "shutdown": cmd_shutdown,
    "push": cmd_push, "pull": cmd_pull,
}


def print_usage(stream):
    stream.write("USAGE: pct <COMMAND> [ARGS] [OPTIONS]\n")
    for name in sorted(USAGE):
        stream.write(f"       {USAGE[name]}\n")
    stream.write("\n(orch sandbox emulation of Proxmox VE's pct)\n")


def main(argv):
    pvelib.perl_warning()
    if not argv:
        sys.stderr.write("ERROR: no command specified\n")
        print_usage(sys.stderr)
        return 255
    name, rest = argv[0], argv[1:]
    if name == "help":
        print_usage(sys.stdout)
        return 0
    command = COMMANDS.get(name)
    if command is None or name == "exec":
        sys.stderr.write(f"ERROR: unknown command 'pct {name}'\n")
        print_usage(sys.stderr)
        return 255
    try:
        pvelib.cli_environment()
        command(rest)
    except PveError as error:
        fail(error, USAGE[name] if isinstance(error, UsageError) else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
