"""The machine payload (payloads/machine.py): GPU models, driver, CUDA and clocks from
nvidia-smi (a fake one printing the shapes real drivers print), and the cgroup limits from a
cgroup tree (made-up v1 and v2 trees, and this machine's own)."""

from __future__ import annotations

import os
import sys

import pytest

from orchestrator.payloads import _gpus
from tests.fixtures.payloads import run_payload

# `nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm,clocks.max.memory,
# power.limit --format=csv,noheader,nounits`: an H200 node, and a board that reports no power
# limit and one clock as "[N/A]" (GeForce and some vGPU profiles do).
MODEL_ROWS = """\
0, NVIDIA H200, 570.124.06, 143771, 1980, 3201, 700.00
1, NVIDIA H200, 570.124.06, 143771, 1980, 3201, 700.00
"""
GEFORCE_ROWS = "0, NVIDIA GeForce RTX 4090, 550.54.15, 24564, 3120, [N/A], [Not Supported]\n"
# The header of plain `nvidia-smi` (recent and older drivers), and `nvidia-smi -q`'s line.
HEADERS = {
    "| NVIDIA-SMI 570.124.06             Driver Version: 570.124.06     CUDA Version: 12.8     |": "12.8",
    "| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |": "12.2",
    "CUDA Version                              : 12.4": "12.4",
    "| NVIDIA-SMI 470.256.02   Driver Version: 470.256.02   CUDA Version: 11.4     |": "11.4",
}
HEADER = ("Tue Dec  2 03:00:00 2026\n"
          "+-----------------------------------------------------------------------------------------+\n"
          "| NVIDIA-SMI 570.124.06             Driver Version: 570.124.06     CUDA Version: 12.8     |\n"
          "|-----------------------------------------+------------------------+----------------------+\n")


def fake_smi(tmp_path, rows: str) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "rows.txt").write_text(rows)
    (tmp_path / "header.txt").write_text(HEADER)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
case "$*" in
  *--query-gpu={_gpus.MODEL_QUERY}*--format=csv,noheader,nounits*) cat {tmp_path}/rows.txt ;;
  "") cat {tmp_path}/header.txt ;;
  *) echo "unexpected query: $*" >&2; exit 2 ;;
esac
""")
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def machine(env=None, root="/nonexistent-cgroup"):
    return run_payload(sys.executable, "machine", {"cgroup_root": str(root)}, env=env,
                       via_stdin=True).expect_result()


def test_an_h200_node_its_driver_and_cuda(tmp_path):
    result = machine(fake_smi(tmp_path, MODEL_ROWS))
    assert result["gpus"][1] == {"index": 1, "name": "NVIDIA H200", "driver": "570.124.06",
                                 "memory_total_mib": 143771.0, "clock_max_sm_mhz": 1980.0,
                                 "clock_max_memory_mhz": 3201.0, "power_limit_w": 700.0}
    assert (result["driver"], result["cuda"]) == ("570.124.06", "12.8")


def test_values_the_board_does_not_report_are_null():
    (row,) = _gpus.parse_rows(GEFORCE_ROWS, _gpus.MODEL_KEYS)
    assert row["name"] == "NVIDIA GeForce RTX 4090" and row["clock_max_sm_mhz"] == 3120.0
    assert row["clock_max_memory_mhz"] is None and row["power_limit_w"] is None
    # a warning line or a row of another shape is skipped, not misread
    assert _gpus.parse_rows("WARNING: infoROM is corrupted at gpu 0000:41:00.0\n" + GEFORCE_ROWS,
                            _gpus.MODEL_KEYS) == [row]


@pytest.mark.parametrize("line,version", HEADERS.items())
def test_the_cuda_version_from_the_header_shapes(line, version):
    assert _gpus.parse_cuda_version(line) == version


def test_the_cuda_version_is_looked_for_only_in_the_header():
    assert _gpus.parse_cuda_version("x" * _gpus.HEADER_CHARS + "CUDA Version: 12.8") is None


def test_a_cpu_container_records_no_gpus_as_absent_not_an_error(tmp_path):
    result = machine({**os.environ, "PATH": str(tmp_path)})      # no nvidia-smi at all
    assert result["gpus"] is None and result["driver"] is None and result["cuda"] is None
    assert result["cgroup"] == {"version": None, "cpu_quota_cores": None, "cpuset": None,
                                "cpuset_cpus": None, "memory_limit_bytes": None}


def tree(root, files: dict):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


def test_cgroup_v2_limits_of_a_proxmox_container(tmp_path):
    root = tree(tmp_path / "cg", {"cgroup.controllers": "cpuset cpu io memory pids",
                                  "cpu.max": "400000 100000", "memory.max": "17179869184",
                                  "cpuset.cpus.effective": "0-3,8,10-11"})
    got = machine({**os.environ, "PATH": str(tmp_path)}, root)["cgroup"]
    assert got == {"version": 2, "cpu_quota_cores": 4.0, "cpuset": "0-3,8,10-11", "cpuset_cpus": 7,
                   "memory_limit_bytes": 17179869184}


def test_cgroup_v2_without_limits(tmp_path):
    root = tree(tmp_path / "cg", {"cgroup.controllers": "cpu memory", "cpu.max": "max 100000",
                                  "memory.max": "max"})
    got = machine({**os.environ, "PATH": str(tmp_path)}, root)["cgroup"]
    assert got["version"] == 2 and got["cpu_quota_cores"] is None and got["memory_limit_bytes"] is None
    assert got["cpuset"] is None and got["cpuset_cpus"] is None


def test_cgroup_v1_limits_and_no_limits(tmp_path):
    root = tree(tmp_path / "cg", {"cpu/cpu.cfs_quota_us": "150000", "cpu/cpu.cfs_period_us": "100000",
                                  "memory/memory.limit_in_bytes": "8589934592",
                                  "cpuset/cpuset.effective_cpus": "0-1"})
    got = machine({**os.environ, "PATH": str(tmp_path)}, root)["cgroup"]
    assert got == {"version": 1, "cpu_quota_cores": 1.5, "cpuset": "0-1", "cpuset_cpus": 2,
                   "memory_limit_bytes": 8589934592}
    tree(root, {"cpu/cpu.cfs_quota_us": "-1", "memory/memory.limit_in_bytes": "9223372036854771712"})
    got = machine({**os.environ, "PATH": str(tmp_path)}, root)["cgroup"]
    assert got["cpu_quota_cores"] is None and got["memory_limit_bytes"] is None


def test_this_machines_own_cgroup_files():
    """The real /sys/fs/cgroup of the machine the tests run on, whichever version it has."""
    result = machine(root="/sys/fs/cgroup")
    assert result["cpu_count"] == os.cpu_count()
    got = result["cgroup"]
    assert got["version"] in (1, 2)
    if got["cpuset_cpus"] is not None:
        assert 1 <= got["cpuset_cpus"] <= os.cpu_count()
    assert got["memory_limit_bytes"] is None or got["memory_limit_bytes"] > 1 << 20


def test_an_unparsable_cgroup_file_is_a_null(tmp_path):
    root = tree(tmp_path / "cg", {"cgroup.controllers": "cpu", "cpu.max": "garbage",
                                  "memory.max": "x" * 10000, "cpuset.cpus.effective": "a-b"})
    got = machine({**os.environ, "PATH": str(tmp_path)}, root)["cgroup"]
    assert got["cpu_quota_cores"] is None and got["memory_limit_bytes"] is None
    assert got["cpuset_cpus"] is None
