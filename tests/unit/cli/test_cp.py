"""`orch cp` on the local transport (a host target on this machine): which side is remote,
destinations, groups, JSON and exit codes; the stream itself is tests/unit/payloads/test_tarstream.py's."""

import json

import pytest

from orchestrator.cli.commands.debug import _remote
from tests.support.cli import inventory, orch  # noqa: F401 (a fixture)
from tests.support.trees import make_tree, snapshot


@pytest.mark.parametrize("argument, parsed", [
    ("ct:/root/x", ("ct", "/root/x")),
    ("ct:", ("ct", "")),
    ("pve:200:/root/a:b", ("pve:200", "/root/a:b")),
    ("group:rel/path", ("group", "rel/path")),
    ("ct:/a name\nwith newline", ("ct", "/a name\nwith newline")),
    ("./local:file", None), ("/abs:x", None), ("dir/x:y", None), ("~/x:y", None), ("plain", None),
])
def test_which_side_is_remote(argument, parsed):
    assert _remote(argument) == parsed


def test_a_tree_goes_out_and_back_with_json(inventory, tmp_path):
    tree = make_tree(tmp_path / "src")
    (tmp_path / "remote").mkdir()
    out = orch("-i", inventory, "cp", "-r", "--json", str(tree), f"dev2:{tmp_path}/remote/")
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)
    assert row["target"] == "dev2" and row["files"] == 3 and row["path"] == f"{tmp_path}/remote/tree"
    out = orch("-i", inventory, "cp", "-r", f"dev2:{tmp_path}/remote/tree", str(tmp_path / "back"))
    assert out.returncode == 0, out.stderr
    assert "sha256 checked" in out.stderr
    assert snapshot(tmp_path / "back") == snapshot(tree)


def test_a_group_push_copies_to_each(inventory, tmp_path):
    (tmp_path / "note").write_text("hi\n")
    (tmp_path / "into").mkdir()
    out = orch("-i", inventory, "cp", str(tmp_path / "note"), f"both:{tmp_path}/into/")
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("sha256 checked") == 2 and (tmp_path / "into" / "note").read_text() == "hi\n"


@pytest.mark.parametrize("args, said", [
    (["a", "b"], "one of SOURCE and DEST must be TARGET:PATH"),
    (["dev:/x", "dev2:/y"], "one of SOURCE and DEST must be TARGET:PATH"),
    (["both:/etc/hostname", "."], "names 2 targets: copy out of one"),
    (["/nonexistent-source", "dev:/tmp/x"], "No such file or directory"),
    (["/etc", "dev:/tmp/x"], "is a folder (copy it with -r)"),
    (["dev:/etc/hostname", "/nonexistent-folder/x"], "no such folder"),
])
def test_bad_command_lines_exit_2_with_a_sentence(inventory, args, said):
    out = orch("-i", inventory, "cp", *args)
    assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr


def test_a_missing_remote_source_exits_1_and_writes_nothing(inventory, tmp_path):
    out = orch("-i", inventory, "cp", f"dev:{tmp_path}/missing", str(tmp_path / "x"))
    assert out.returncode == 1 and "No such file or directory" in out.stderr
    assert not (tmp_path / "x").exists()


class _Terminal:
    def __init__(self, tty):
        self.tty, self.text = tty, ""

    def isatty(self):
        return self.tty

    def write(self, text):
        self.text += text

    def flush(self):
        pass


@pytest.mark.parametrize("tty", [True, False])
def test_progress_shows_only_on_a_terminal_and_only_for_a_long_copy(monkeypatch, tty):
    from orchestrator.cli.commands import debug
    clock = [100.0]
    monkeypatch.setattr(debug.time, "monotonic", lambda: clock[0])
    terminal = _Terminal(tty)
    progress = debug._Progress(terminal)
    progress.sized({"bytes": 50_000_000, "files": 1})
    progress.add(1_000_000)          # within the first second: nothing
    assert terminal.text == ""
    clock[0] += 2
    progress.add(24_000_000)
    progress.close()
    assert terminal.text == ("\r\x1b[K25.0 MB of 50.0 MB (50 %), 12.5 MB/s\r\x1b[K" if tty else "")
