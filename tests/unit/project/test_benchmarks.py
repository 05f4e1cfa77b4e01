"""The benchmarks clean up after themselves; their shared timing is what it says."""

import os
import subprocess
import sys

import pytest

from benchmarks import grep_torch, timing


def test_grep_torch_removes_its_sandbox_state_however_it_ends():
    with grep_torch.sandbox_state() as state:
        open(os.path.join(state, "written-by-the-sandbox"), "w").close()
    assert not os.path.exists(state)
    with pytest.raises(RuntimeError):
        with grep_torch.sandbox_state() as state:
            raise RuntimeError("the sandbox did not come up")
    assert not os.path.exists(state)


def test_timing_warms_up_once_then_times_each_call():
    calls = []
    samples = timing.samples_ms(lambda: calls.append(1), 5)
    assert len(calls) == 6 and len(samples) == 5 and all(s >= 0 for s in samples)
    row = timing.summary([5.0, 1.0, 3.0, 2.0, 4.0])
    assert row == {"median_ms": 3.0, "p95_ms": 4.0, "n": 5}
    assert timing.latency_row([0.1, 0.3, 0.2]) == {"median_ms": 200.0, "p95_ms": 300.0, "max_ms": 300.0}


BENCHMARKS = sorted(name for name in os.listdir(os.path.dirname(timing.__file__))
                    if name.endswith(".py") and name not in ("__init__.py", "timing.py"))


@pytest.mark.parametrize("script", BENCHMARKS)
def test_every_benchmark_still_starts(script):
    """A benchmark is run by hand, rarely: its imports must follow orch's moves (`--help`
    imports everything the script needs, then exits before touching a host)."""
    path = os.path.join(os.path.dirname(timing.__file__), script)
    done = subprocess.run([sys.executable, path, "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


def test_fanout_spreads_each_size_over_the_hosts_and_keeps_to_what_the_sandbox_holds():
    from benchmarks import fanout
    names = [f"sb{h}-20{c}" for h in (1, 2, 3) for c in (0, 1)]
    inventory = {"containers": {n: {"host": n.split("-")[0], "vmid": 200, "venv": "/root/venv"}
                                for n in names},
                 "groups": {"running": names}}
    inventory, sizes = fanout.fan_inventory(inventory, [1, 2, 4, 8])
    assert sizes == [1, 2, 4]   # 6 containers: no 8
    assert inventory["groups"]["fan-4"] == ["sb1-200", "sb2-200", "sb3-200", "sb1-201"]
    assert all("venv" not in spec for spec in inventory["containers"].values())
