"""orch cp at the sizes of issue 30 against the sandbox: a 200 MB file and a tree of 10,000
small files (with a symlink, an empty folder, a name with a space and a newline, modes),
each pushed into a container and pulled back by a real `orch` process, sha256 equal,
orch's peak RSS bounded. Marked slow: each runs once (no direct/agent legs; module-scoped
inputs), and `-m "not slow"` leaves them out of a quick run."""

from __future__ import annotations

import os

import pytest

from tests.integration.test_cp_sandbox import (RSS_LIMIT_MB, a_remote_dir, random_file,
                                               round_trip_file, run_measured)
from tests.support.trees import make_tree, snapshot

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

BIG_MB = 200
TREE_FILES = 10_000


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    return random_file(tmp_path_factory.mktemp("big200") / "big.bin", BIG_MB)


@pytest.fixture(scope="module")
def wide_tree(tmp_path_factory):
    """make_tree's odd entries plus TREE_FILES small files in 100 folders."""
    tree = make_tree(tmp_path_factory.mktemp("wide"))
    for index in range(TREE_FILES - 3):
        folder = tree / "many" / f"d{index % 100:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{index:05d}.txt").write_bytes(f"file {index}\n".encode() * (1 + index % 7))
    (tree / "many").chmod(0o750)
    return tree


@pytest.fixture
def remote_dir(ct):
    yield from a_remote_dir(ct, "cp-big", removal_timeout=120)


def test_a_200_mb_file_round_trips_intact_with_bounded_memory(sandbox, ct, remote_dir, big,
                                                             tmp_path):
    pushed_rss, pulled_rss = round_trip_file(sandbox, ct, remote_dir, big, tmp_path)
    print(f"peak RSS of orch for {BIG_MB} MB: push {pushed_rss:.0f} MB, pull {pulled_rss:.0f} MB")
    assert pushed_rss < RSS_LIMIT_MB and pulled_rss < RSS_LIMIT_MB


def test_a_tree_of_ten_thousand_files_round_trips_intact(sandbox, ct, remote_dir, wide_tree,
                                                         tmp_path):
    code, err, _ = run_measured(sandbox, "cp", "-r", str(wide_tree), f"sb1-200:{remote_dir}/")
    assert code == 0, err
    assert f"{TREE_FILES} file(s)" in err, err
    counted = ct.run(["sh", "-c", 'find "$1" -type f -printf x | wc -c', "sh", f"{remote_dir}/tree"],
                     timeout=120).check().text.strip()
    assert counted == str(TREE_FILES)
    code, err, rss = run_measured(sandbox, "cp", "-r", f"sb1-200:{remote_dir}/tree",
                                  str(tmp_path / "back"))
    assert code == 0, err
    assert snapshot(tmp_path / "back") == snapshot(wide_tree)
    print(f"peak RSS of orch pulling {TREE_FILES} files: {rss:.0f} MB")
    assert rss < RSS_LIMIT_MB
