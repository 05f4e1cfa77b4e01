"""fan_out: every input's value or OrchError, sorted into succeeded and failed, both ordered
as the inputs (like Fabric's GroupResult), whatever order the work finishes in."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator.ground.errors import HostUnreachable, OrchError
from orchestrator.targets.fleet import GroupResult, fan_out


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
