"""The sandbox layout's per-container choice of root (no sandbox needed)."""

import pytest

from orch_sandbox import roots
from orch_sandbox.layout import ContainerSpec, Layout, LayoutError, build_layout


def test_real_root_containers_are_chosen_per_vmid_on_every_host():
    layout = build_layout(2, 3, 1, real_root=(201,))
    for host in layout.hosts:
        assert [(ct.vmid, ct.root) for ct in host.containers] == [
            (200, "host"), (201, "debian-12"), (202, "host")]
        assert host.container(201).real_root and not host.container(200).real_root


def test_a_real_root_vmid_outside_the_layout_is_refused():
    with pytest.raises(LayoutError, match="--real-root 207: the layout's containers are 200, 201, 202"):
        build_layout(1, 3, 0, real_root=(201, 207))


def test_layout_json_round_trips_and_reads_files_written_before_real_roots():
    layout = build_layout(1, 2, 0, real_root=(200,))
    assert Layout.from_json(layout.to_json()) == layout
    old = ('{"prefix": "sb", "hosts": [{"name": "sb1", "containers": '
           '[{"vmid": 200, "running": true}]}]}')
    assert Layout.from_json(old).hosts[0].containers == (ContainerSpec(200, True, "host"),)


def test_the_root_cache_is_named_after_the_recipe_and_the_machine_sources(tmp_path, monkeypatch):
    monkeypatch.setenv(roots.CACHE_ENV, str(tmp_path))
    sources = tmp_path / "debian.sources"
    sources.write_text("Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n")
    monkeypatch.setattr(roots, "machine_sources", lambda: [sources])
    first = roots.tarball_path("debian-12")
    assert first.parent == tmp_path and first.name.startswith("debian-12-")
    sources.write_text("Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n")
    assert roots.tarball_path("debian-12") != first
    with pytest.raises(roots.SandboxError, match="unknown root distribution 'plan9'"):
        roots.tarball_path("plan9")


def test_an_older_release_is_built_from_the_same_mirrors_with_its_suites_renamed(tmp_path, monkeypatch):
    monkeypatch.setenv(roots.CACHE_ENV, str(tmp_path / "cache"))
    deb822 = tmp_path / "debian.sources"
    deb822.write_text("Types: deb\nURIs: http://deb.debian.org/debian\n"
                      "Suites: bookworm bookworm-updates\nComponents: main\n\n"
                      "Types: deb\nURIs: http://deb.debian.org/debian-security\n"
                      "Suites: bookworm-security\nComponents: main\n")
    one_line = tmp_path / "extra.list"
    one_line.write_text("deb [arch=amd64] http://mirror.example/debian bookworm main contrib\n")
    monkeypatch.setattr(roots, "machine_sources", lambda: [deb822, one_line])
    assert roots.sources_for(roots.recipe("debian-12")) == [deb822, one_line]
    derived = roots.sources_for(roots.recipe("debian-11"))
    texts = [path.read_text() for path in derived]
    assert "Suites: bullseye bullseye-updates\n" in texts[0] and "Suites: bullseye-security\n" in texts[0]
    assert "http://deb.debian.org/debian\n" in texts[0] and "bookworm" not in texts[0]
    assert texts[1] == "deb [arch=amd64] http://mirror.example/debian bullseye main contrib\n"
    assert roots.tarball_path("debian-11").name.startswith("debian-11-")


def test_a_bind_mounted_container_starts_with_its_loopback_up(tmp_path):
    """A real CT's init brings `lo` up; the sandbox's containers run orch-ct-init first, which
    does the same (checked here in a fresh network namespace, where lo starts down)."""
    import shutil
    import subprocess

    from orch_sandbox.containers import CT_INIT, container_dir, write_container
    from orch_sandbox.paths import StatePaths

    paths = StatePaths(tmp_path)
    host = build_layout(1, 1, 0).hosts[0]
    ct = host.containers[0]
    write_container(paths, host, ct)
    directory = container_dir(paths, host, ct.vmid)
    config = (directory / "config").read_text()
    assert f"-- /bin/sh /{CT_INIT} /bin/sleep infinity" in config
    script = directory / "rootfs" / CT_INIT
    if not shutil.which("unshare"):
        pytest.skip("no unshare to make a network namespace")
    before = subprocess.run(["unshare", "-rn", "ip", "-o", "link", "show", "lo"], capture_output=True, text=True)
    if before.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {before.stderr.strip()}")
    assert ",UP" not in before.stdout and "<LOOPBACK>" in before.stdout
    after = subprocess.run(["unshare", "-rn", "sh", str(script), "ip", "-o", "link", "show", "lo"],
                           capture_output=True, text=True, timeout=30)
    assert after.returncode == 0, after.stderr
    assert "LOOPBACK,UP" in after.stdout


def test_every_container_gets_a_fixed_address_of_its_own_on_the_shared_network():
    """10.88.HOST.(VMID mod 256): distinct across hosts and vmids, the same at every up."""
    for layout in (build_layout(3, 50, 0), build_layout(8, 50, 0, cluster="lab")):
        addresses = [ct.address for host in layout.hosts for ct in host.containers]
        macs = [ct.hwaddr for host in layout.hosts for ct in host.containers]
        assert len(set(addresses)) == len(addresses) and len(set(macs)) == len(macs)
        assert all(a.startswith("10.88.") for a in addresses)
        assert Layout.from_json(layout.to_json()) == layout
    ct = build_layout(2, 3, 1).host("sb2").container(201)
    assert (ct.address, ct.hwaddr, ct.veth_pair) == ("10.88.2.201", "bc:24:11:58:02:c9",
                                                     "veth201i0")


def test_container_configs_put_eth0_on_vmbr0_with_the_layout_address(tmp_path):
    from orch_sandbox.containers import container_dir, pve_config, write_container
    from orch_sandbox.paths import StatePaths

    host = build_layout(1, 1, 0).hosts[0]
    ct = host.containers[0]
    assert write_container(StatePaths(tmp_path), host, ct) is True
    assert write_container(StatePaths(tmp_path), host, ct) is False   # unchanged: no restart
    config = (container_dir(StatePaths(tmp_path), host, ct.vmid) / "config").read_text()
    for line in ("lxc.net.0.type = veth", "lxc.net.0.link = vmbr0", "lxc.net.0.name = eth0",
                 "lxc.net.0.flags = up", "lxc.net.0.ipv4.address = 10.88.1.200/16",
                 "lxc.net.0.veth.pair = veth200i0"):
        assert line + "\n" in config
    assert "net0: name=eth0,bridge=vmbr0,hwaddr=BC:24:11:58:01:C8,ip=10.88.1.200/16,type=veth" \
        in pve_config(ct)
    hosts = (container_dir(StatePaths(tmp_path), host, ct.vmid) / "hosts").read_text()
    assert "10.88.1.200 CT200\n" in hosts and "127.0.1.1" not in hosts   # Proxmox, static IP


def test_each_host_has_a_bridge_address_no_container_has():
    """10.88.0.HOST: a CT's third octet is its host's index, never 0."""
    for layout in (build_layout(99, 50, 0), build_layout(8, 50, 0, cluster="lab")):
        bridges = [host.bridge_address for host in layout.hosts]
        addresses = {ct.address for host in layout.hosts for ct in host.containers}
        assert len(set(bridges)) == len(bridges) and not addresses & set(bridges)
        assert Layout.from_json(layout.to_json()).hosts[1].bridge_address == "10.88.0.2"


def test_a_cgroup_that_cannot_be_made_is_a_sandbox_error_not_a_traceback(tmp_path, monkeypatch):
    from orch_sandbox import system
    hidden = tmp_path / "pids"
    hidden.write_text("")              # where the hierarchy should be: mountinfo lists it, a mount hides it
    monkeypatch.setattr(system, "tagging_hierarchy", lambda: hidden)
    with pytest.raises(system.SandboxError, match=r"cannot put process 42 into cgroup .*pids/orch-sandbox/sb1"):
        system.move_to_cgroup(42, "orch-sandbox/sb1")
