"""fan_out: every input's value or OrchError, sorted into succeeded and failed, both ordered
as the inputs (like Fabric's GroupResult), whatever order the work finishes in."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from orchestrator.ground import invocation
from orchestrator.ground.errors import HostUnreachable, OrchError
from orchestrator.targets.fleet import GroupResult, fan_out, spread_by_host


class Item:
    """A target-like input: hashed by identity, named."""

    def __init__(self, name: str, delay: float = 0.0, fails: bool = False):
        self.name, self.delay, self.fails = name, delay, fails


def work(item: Item) -> dict:
    time.sleep(item.delay)
    if item.fails:
        raise HostUnreachable(f"{item.name}: no route")
    return {"event": "result", "value": item.name.upper()}


def test_succeeded_and_failed_keep_the_input_order_not_the_finishing_order():
    items = [Item("a", 0.15), Item("b", 0.0, fails=True), Item("c", 0.05), Item("d", 0.1, fails=True),
             Item("e", 0.0)]
    result = fan_out(items, work)
    assert [i.name for i in result.succeeded] == ["a", "c", "e"]
    assert [i.name for i in result.failed] == ["b", "d"]
    assert result.succeeded[items[0]]["value"] == "A"
    assert all(isinstance(e, HostUnreachable) for e in result.failed.values())
    assert not result.ok
    assert result.first_error() is result.failed[items[1]]


def test_the_work_runs_at_once():
    started = threading.Barrier(4, timeout=5)   # breaks (an error) unless all four run together
    result = fan_out(["w", "x", "y", "z"], lambda name: started.wait() is not None and name)
    assert list(result.succeeded) == ["w", "x", "y", "z"] and result.ok


def test_all_succeeded_has_no_first_error():
    result = fan_out([Item("only")], work)
    assert result.ok and result.failed == {} and result.first_error() is None


def test_rows_are_the_json_of_each_target_in_order():
    items = [Item("a"), Item("b", fails=True)]
    assert fan_out(items, work).rows() == [{"target": "a", "value": "A"},
                                           {"target": "b", "error": "b: no route"}]


def test_an_error_that_is_not_orchs_is_not_swallowed():
    def broken(item):
        raise ValueError("a bug")
    with pytest.raises(ValueError, match="a bug"):
        fan_out([Item("a"), Item("b")], broken)


def test_an_interrupt_runs_on_interrupt_and_propagates():
    closed = []

    def interrupted(item):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fan_out([Item("a"), Item("b")], interrupted, on_interrupt=lambda: closed.append(True))
    assert closed == [True]


def test_a_group_result_of_no_inputs():
    result = GroupResult([], [])
    assert result.ok and result.rows() == [] and result.succeeded == {}


def test_an_orch_error_value_counts_as_failed():
    error = OrchError("x")
    result = GroupResult(["p", "q"], [error, 1])
    assert result.failed == {"p": error} and result.succeeded == {"q": 1}


class Host:
    def __init__(self, name: str):
        self.name = name


class Target:
    """A target-like input on a host (what spread_by_host reads: .host.name)."""

    def __init__(self, host: str, vmid: int):
        self.host, self.name = Host(host), f"{host}-{vmid}"


def test_jobs_bounds_how_many_run_at_once():
    running, most, lock = [0], [0], threading.Lock()

    def counted(name):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return name
    result = fan_out([f"t{i}" for i in range(12)], counted, jobs=3)
    assert result.ok and list(result.succeeded) == [f"t{i}" for i in range(12)]
    assert most[0] == 3


def test_targets_start_host_by_host_in_turn():
    """With fewer jobs than targets, the first wave reaches every host (its connection is
    set up at once), not the first host's containers only."""
    items = [Target(host, vmid) for host in ("sb1", "sb2", "sb3") for vmid in (200, 201)]
    assert [items[i].name for i in spread_by_host(items)] == [
        "sb1-200", "sb2-200", "sb3-200", "sb1-201", "sb2-201", "sb3-201"]
    started = []
    fan_out(items, lambda target: started.append(target.name), jobs=1)
    assert started[:3] == ["sb1-200", "sb2-200", "sb3-200"]
    assert spread_by_host(["a", "b", "c"]) == [0, 1, 2]   # no host: the order given


def test_on_done_is_told_of_every_outcome_as_it_ends():
    seen = []
    items = [Item("a"), Item("b", fails=True), Item("c")]
    fan_out(items, work, on_done=lambda item, outcome: seen.append((item.name, type(outcome).__name__)))
    assert sorted(seen) == [("a", "dict"), ("b", "HostUnreachable"), ("c", "dict")]


class Channel:
    """Blocks its reader until closed, as a remote command's channel does."""

    def __init__(self):
        self.closed = threading.Event()

    def close(self):
        self.closed.set()


def test_an_interrupt_closes_the_running_channels_and_starts_nothing_more():
    """Ctrl-C while every job waits on a remote command: the command's channels are closed
    (the waits end, the remote commands are killed), the targets not yet started never
    start, and the interrupt does not wait for the commands to end by themselves."""
    started, channels = [], []

    def remote(name):
        channel = Channel()
        channels.append(channel)
        invocation.current().interrupt.file(channel)
        started.append(name)
        if not channel.closed.wait(30):
            raise AssertionError("the channel was never closed")
        raise HostUnreachable(f"{name}: channel closed")

    threading.Timer(0.3, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)).start()
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        fan_out([f"t{i}" for i in range(8)], remote, jobs=4)
    assert time.monotonic() - began < 5
    assert len(started) == 4 and all(channel.closed.is_set() for channel in channels)
