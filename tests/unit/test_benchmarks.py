"""The benchmarks clean up after themselves."""

import os

import pytest

from benchmarks import grep_torch


def test_grep_torch_removes_its_sandbox_state_however_it_ends():
    with grep_torch.sandbox_state() as state:
        open(os.path.join(state, "written-by-the-sandbox"), "w").close()
    assert not os.path.exists(state)
    with pytest.raises(RuntimeError):
        with grep_torch.sandbox_state() as state:
            raise RuntimeError("the sandbox did not come up")
    assert not os.path.exists(state)
