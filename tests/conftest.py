"""Shared test settings: keep every test's orch data out of the user's home."""

import pytest


@pytest.fixture(autouse=True)
def _isolated_data_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ORCH_DATA_DIR", str(tmp_path_factory.mktemp("orch-data")))
