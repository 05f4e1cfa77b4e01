"""What the sandbox's emulated `pct` and `pvesh` share: a Proxmox node's containers.

These tools run ON a sandbox host (inside its network, mount and UTS namespaces), as
root, with the machine's /usr/bin/python3 and the standard library only. The node's state
is read the way Proxmox reads it:

- the node name is the host name (`hostname` inside the host's UTS namespace);
- a container exists when /etc/pve/nodes/NODE/lxc/VMID.conf exists;
- it runs when its LXC monitor listens on the abstract socket @/var/lib/lxc/VMID/command
  (abstract sockets belong to a network namespace, so two hosts can both have a CT 200).

Texts and exit codes follow pve-container's src/PVE/CLI/pct.pm and PVE::JSONSchema: the
table of what is reproduced, and why the tools are built this way, is in docs/design/sandbox.md;
where each one comes from upstream, in docs/design/proxmox-semantics.md. `pct exec` is on the path
of every command orch runs, so this module imports only what that path needs.
"""

import os
import sys

PVE_DIR = "/etc/pve"
LXC_PATH = "/var/lib/lxc"
PCT_SOURCE = "/usr/share/perl5/PVE/CLI/pct.pm"  # perl's "die" without \n names its line
BOOLEAN_WORDS = {"1": True, "0": False, "true": True, "false": False, "yes": True,
                 "no": False, "on": True, "off": False}


class PveError(Exception):
    """An error the real tool reports: text on stderr, then exit (255 like perl's die)."""

    def __init__(self, message, exit_code=255):
        # perl's die exits with errno when one is set, else 255 (the real CLI has no eval
        # around its handler): a missing config leaves ENOENT (2) behind
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class UsageError(PveError):
    """A command-line mistake; the real CLIHandler prints the command's usage after it."""


def fail(error, usage_line=None):
    """Print a PveError as the real CLI does and exit with its code."""
    text = error.message.rstrip("\n")
    if isinstance(error, UsageError) and usage_line:
        # a parameter-verification message ends in "\n": the real CLI leaves a blank line
        text += ("\n\n" if error.message.endswith("\n") else "\n") + usage_line
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
    sys.exit(error.exit_code)


# --- command line, the way PVE::CLIHandler (Getopt::Long, permute) reads it ---------------

def parse_command_line(argv, positional, options, extra_args=False):
    """Split argv into positional parameters, options and extra args.

    positional: parameter names in order; options: {name: "boolean" | "string"}.
    Options may appear anywhere before `--` (Getopt::Long's permute); after `--` every
    token is an extra arg, even one that starts with a dash. Returns (params, extra).
    """
    params, extra = {}, []
    names = list(positional)
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if token == "--":
            if not extra_args and argv[index:]:
                raise UsageError("400 too many arguments")
            extra.extend(argv[index:])
            break
        if token.startswith("-") and len(token) > 1:
            index = _parse_option(token, argv, index, options, params)
            continue
        if names:
            params[names.pop(0)] = token
        elif extra_args:
            extra.append(token)
        else:
            raise UsageError("400 too many arguments")
    if names:
        raise UsageError("400 not enough arguments")
    return params, extra


def _parse_option(token, argv, index, options, params):
    name, has_value, value = token.lstrip("-").partition("=")
    if name not in options:
        raise UsageError(f"Unknown option: {name}\n400 unable to parse option")
    if options[name] == "boolean":
        if not has_value and index < len(argv) and argv[index].lower() in BOOLEAN_WORDS:
            value, has_value, index = argv[index], "=", index + 1
        if not has_value:
            value = "1"
        if value.lower() not in BOOLEAN_WORDS:
            raise UsageError("400 Parameter verification failed.\n"
                             f"{name}: type check ('boolean') failed - got '{value}'\n")
        params[name] = BOOLEAN_WORDS[value.lower()]
        return index
    if not has_value:
        if index >= len(argv):
            raise UsageError(f"Option {name} requires an argument\n400 unable to parse option")
        value, index = argv[index], index + 1
    params[name] = value
    return index


def valid_vmid(vmid):
    """PVE::JSONSchema's pve-vmid format, ^[1-9][0-9]{2,8}$ (without importing re)."""
    return vmid.isascii() and vmid.isdigit() and 3 <= len(vmid) <= 9 and vmid[0] != "0"


def check_vmid(vmid):
    """The vmid parameter, or the CLI's parameter-verification error."""
    if not valid_vmid(vmid):
        raise UsageError("400 Parameter verification failed.\n"
                         "vmid: invalid format - value does not look like a valid VM ID\n")
    return vmid


# --- the node and its containers -----------------------------------------------------------

def nodename():
    """PVE::INotify::nodename: the host name without its domain part."""
    return os.uname().nodename.split(".")[0]


# The real CLIs set this PATH before anything runs (PVE::CLIHandler::run_cli_handler); with
# keep-env it is also the PATH of every command `pct exec` runs in a container.
CLI_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"
ENOENT = 2


def cli_environment():
    """What run_cli_handler and setup_default_cli_env do before any command runs."""
    os.environ["PATH"] = CLI_PATH
    if os.geteuid() != 0:
        raise PveError("please run as root")


def perl_warning():
    """What perl prints before anything else on a host that lacks the client's locale."""
    text = knob("perl-warning")
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()


def knob(name):
    """A sandbox-only switch of this node (/etc/pve/nodes/NODE/.orch-sandbox/NAME), or None.
    Tests use them to make the emulation print a warning on stderr or wait longer."""
    try:
        with open(os.path.join(PVE_DIR, "nodes", nodename(), ".orch-sandbox", name),
                  encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def config_relpath(vmid):
    return f"nodes/{nodename()}/lxc/{vmid}.conf"


def config_path(vmid):
    return os.path.join(PVE_DIR, config_relpath(vmid))


def load_config(vmid, node=None):
    """The container's PVE config as {key: value}; dies like PVE::AbstractConfig."""
    relpath = f"nodes/{node}/lxc/{vmid}.conf" if node else config_relpath(vmid)
    try:
        with open(os.path.join(PVE_DIR, relpath), encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise PveError(f"Configuration file '{relpath}' does not exist",
                       exit_code=ENOENT) from None
    return parse_config(text)


def parse_config(text):
    """Parse 'key: value' lines; leading '#' lines are the description; stop at snapshots."""
    config, description = {}, []
    for line in text.splitlines():
        if line.startswith("["):
            break  # a snapshot section: not the current config
        if line.startswith("#"):
            description.append(line[1:])
            continue
        key, sep, value = line.partition(":")
        if sep and key.strip():
            config[key.strip()] = value.strip()
    if description:
        config["description"] = "\n".join(description)
    return config


def cluster_nodes():
    """Every node of the cluster: the directories of /etc/pve/nodes (one when standalone)."""
    try:
        return sorted(name for name in os.listdir(os.path.join(PVE_DIR, "nodes"))
                      if os.path.isdir(os.path.join(PVE_DIR, "nodes", name, "lxc")))
    except FileNotFoundError:
        return [nodename()]


STATUS_FILE = ".orch-sandbox-status.json"


def publish_status(running):
    """Tell the other nodes which of this node's containers run (pvestatd's broadcast)."""
    import json

    path = os.path.join(PVE_DIR, "nodes", nodename(), STATUS_FILE)
    try:
        with open(path + ".tmp", "w", encoding="ascii") as handle:
            json.dump(sorted(running), handle)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def published_status(node):
    """The running vmids another node last published, or None when it never did."""
    import json

    try:
        with open(os.path.join(PVE_DIR, "nodes", node, STATUS_FILE), encoding="ascii") as handle:
            return set(json.load(handle))
    except (OSError, ValueError):
        return None


def list_vmids(node=None):
    """VMIDs with a config on this node (or on `node`), sorted numerically."""
    directory = os.path.join(PVE_DIR, "nodes", node or nodename(), "lxc")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    vmids = [name[:-5] for name in names if name.endswith(".conf")]
    return sorted((v for v in vmids if valid_vmid(v)), key=int)


def running_vmids():
    """VMIDs whose LXC monitor socket exists in this host's network namespace."""
    prefix, suffix = "@" + LXC_PATH + "/", "/command"
    running = set()
    with open("/proc/net/unix", encoding="ascii", errors="replace") as handle:
        for line in handle:
            path = line.rstrip("\n").rpartition(" ")[2]
            if path.startswith(prefix) and path.endswith(suffix):
                running.add(path[len(prefix):-len(suffix)])
    return running


def is_running(vmid):
    return vmid in running_vmids()


def init_pid(vmid):
    """PID (on the host) of the container's init, or None when it is not running."""
    import subprocess

    result = subprocess.run(["lxc-info", "-n", vmid, "-p", "-H"], capture_output=True,
                            text=True, check=False)
    text = result.stdout.strip()
    return int(text) if result.returncode == 0 and text.isdigit() else None


def lxc_command(argv, what):
    """Run an LXC tool; its failure becomes the PVE-style error `what`."""
    import subprocess

    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = result.stderr.strip().splitlines()
        raise PveError(what + (f": {detail[-1]}" if detail else ""))


# --- vmstatus: the fields PVE::LXC::vmstatus reports ----------------------------------------

def parse_size(text):
    """A PVE disk size ('8G', '512M', '100') in bytes; plain numbers are GiB like PVE."""
    import re

    match = re.match(r"^(\d+(?:\.\d+)?)([KMGT])?$", text or "")
    if not match:
        return None
    number, unit = float(match.group(1)), match.group(2) or "G"
    return int(number * 1024 ** "KMGT".index(unit) * 1024)


def rootfs_size(config):
    for part in config.get("rootfs", "").split(","):
        key, _, value = part.partition("=")
        if key == "size":
            return parse_size(value)
    return None


def vm_status(vmid, config, running):
    """One container's status dict: the keys /nodes/NODE/lxc and status/current carry."""
    import re

    status = {
        "vmid": int(vmid), "type": "lxc", "status": "running" if running else "stopped",
        "name": re.sub(r"\s", "", config.get("hostname") or f"CT{vmid}"),
        # PVE::LXC::vmstatus: cores || cpulimit as the config holds it (a string in the
        # JSON, "1.5" for a fractional limit), else the node's CPU count (a number)
        "cpus": config.get("cores") or config.get("cpulimit") or os.cpu_count() or 1,
        "maxmem": int(config.get("memory") or 512) * 1024 * 1024,
        "maxswap": int(config.get("swap") or 0) * 1024 * 1024,
        "maxdisk": rootfs_size(config) or 4 * 1024 ** 3,
        "mem": 0, "swap": 0, "disk": 0, "uptime": 0, "cpu": 0,
        "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0,
    }
    if config.get("lock"):
        status["lock"] = config["lock"]
    if config.get("template"):
        status["template"] = 1
    if config.get("tags"):
        status["tags"] = config["tags"]
    pid = init_pid(vmid) if running else None
    if pid:
        status.update(_live_usage(pid))
    return status


def _live_usage(pid):
    usage = {"pid": pid, "uptime": _process_uptime(pid)}
    memory = _cgroup_memory(pid)
    if memory is not None:
        usage["mem"] = memory
    try:
        fs = os.statvfs(f"/proc/{pid}/root")
        usage["disk"] = (fs.f_blocks - fs.f_bfree) * fs.f_frsize
        usage["maxdisk"] = fs.f_blocks * fs.f_frsize
    except OSError:
        pass
    return usage


def _process_uptime(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rpartition(")")[2].split()
        with open("/proc/uptime", encoding="ascii") as handle:
            uptime = float(handle.read().split()[0])
    except OSError:
        return 0
    start_ticks = int(fields[19])  # field 22 of /proc/PID/stat, counted after "comm)"
    return max(0, int(uptime - start_ticks / os.sysconf("SC_CLK_TCK")))


def _cgroup_memory(pid):
    """Memory use of the container's cgroup (v1 memory controller, or v2 memory.current)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            candidate = f"/sys/fs/cgroup/memory{path}/memory.usage_in_bytes"
        elif controllers == "":
            candidate = f"/sys/fs/cgroup{path}/memory.current"
        else:
            continue
        try:
            with open(candidate, encoding="ascii") as handle:
                return int(handle.read().strip())
        except (OSError, ValueError):
            continue
    return None


def node_status():
    """The node's entry in /nodes: memory, CPUs and uptime of the machine."""
    meminfo = {}
    with open("/proc/meminfo", encoding="ascii") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            meminfo[key] = int(rest.split()[0]) * 1024
    with open("/proc/uptime", encoding="ascii") as handle:
        uptime = int(float(handle.read().split()[0]))
    fs = os.statvfs("/")
    node = nodename()
    return {
        "node": node, "id": f"node/{node}", "type": "node", "status": "online", "level": "",
        "cpu": round(os.getloadavg()[0] / (os.cpu_count() or 1), 4),
        "maxcpu": os.cpu_count() or 1,
        "mem": meminfo["MemTotal"] - meminfo.get("MemAvailable", meminfo["MemFree"]),
        "maxmem": meminfo["MemTotal"],
        "disk": (fs.f_blocks - fs.f_bfree) * fs.f_frsize, "maxdisk": fs.f_blocks * fs.f_frsize,
        "uptime": uptime,
        "ssl_fingerprint": "00:" * 31 + "00",
    }
