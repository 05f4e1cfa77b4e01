"""The machine payload in a real LXC container of the sandbox (CT 200 of sb1, no GPU): GPUs
recorded as absent, and the cgroup limits the container's own files say, read back here with
`cat` and parsed independently of the payload. The sandbox's containers are nested in the
test machine's own container and may see no cgroup filesystem at all: then every limit is
null and the version too (nothing to read is not an error)."""

from __future__ import annotations

import pytest

from orchestrator.remote import payload_api

pytestmark = pytest.mark.sandbox


def cat(ct, path):
    done = ct.run(["cat", path], timeout=30)
    return done.text.strip() if done.ok else None


def test_a_cpu_container_its_cgroup_limits_and_no_gpus(ct):
    facts = payload_api.machine(ct)
    assert facts["gpus"] is None and facts["driver"] is None and facts["cuda"] is None
    assert facts["cpu_count"] >= 1
    cgroup = facts["cgroup"]
    v2 = cat(ct, "/sys/fs/cgroup/cgroup.controllers") is not None
    v1 = ct.run(["test", "-d", "/sys/fs/cgroup/memory"], timeout=30).ok or \
        ct.run(["test", "-d", "/sys/fs/cgroup/cpu"], timeout=30).ok
    assert cgroup["version"] == (2 if v2 else 1 if v1 else None)
    if not (v1 or v2):
        assert cgroup == {"version": None, "cpu_quota_cores": None, "cpuset": None,
                          "cpuset_cpus": None, "memory_limit_bytes": None}
        return
    if v2:
        memory, cpu = cat(ct, "/sys/fs/cgroup/memory.max"), cat(ct, "/sys/fs/cgroup/cpu.max")
        cpuset = cat(ct, "/sys/fs/cgroup/cpuset.cpus.effective")
    else:
        memory = cat(ct, "/sys/fs/cgroup/memory/memory.limit_in_bytes")
        quota, period = (cat(ct, f"/sys/fs/cgroup/cpu/cpu.cfs_{n}_us") for n in ("quota", "period"))
        cpu = None if quota in (None, "-1") else f"{quota} {period}"
        cpuset = cat(ct, "/sys/fs/cgroup/cpuset/cpuset.effective_cpus")
    expected_memory = int(memory) if memory and memory.isdigit() and int(memory) < 1 << 62 else None
    assert cgroup["memory_limit_bytes"] == expected_memory
    if cpu and not cpu.startswith("max"):
        quota, period = cpu.split()
        assert cgroup["cpu_quota_cores"] == pytest.approx(int(quota) / int(period))
    else:
        assert cgroup["cpu_quota_cores"] is None
    assert cgroup["cpuset"] == (cpuset or None)
