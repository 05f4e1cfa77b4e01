"""orch schedule: systemd units checked by systemd-analyze verify, crontab lines parsed and
run through /bin/sh, hostile arguments quoted exactly once, install/list/remove."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from orchestrator.cli.app import main
from orchestrator.ground import console
from orchestrator.ground.errors import ConfigError
from orchestrator.nightly import schedule as sched

HOSTILE = ["50%", "$HOME", "a b", 'q"uote', "back\\slash", "semi;colon", "'single'", "$(id)",
           "`id`", "%n%%", "tab\there", "*", "~", "-e", "é ü"]


@pytest.fixture
def playbook(tmp_path):
    path = tmp_path / "play books" / "dflash.yaml"
    path.parent.mkdir()
    path.write_text("name: dflash\n")
    return str(path)


def entry_for(playbook, kind="systemd-user", at="02:30", extra=()):
    return sched.make_entry(playbook, at, kind=kind, targets=["sb1-200"],
                            extra_vars=[f"msg={h}" for h in extra], inventory=None)


# ------------------------------------------------------------------ systemd
def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if not path:
        if os.environ.get("CI"):
            pytest.fail("systemd-analyze missing (package systemd, in .ci/apt-packages.txt)")
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    return path


def test_units_pass_systemd_analyze_verify(tmp_path, playbook, monkeypatch):
    monkeypatch.setenv("ORCH_DATA_DIR", str(tmp_path / "data 50%"))
    entry = sched.install(entry_for(playbook, extra=HOSTILE), dest=str(tmp_path / "units"))
    assert [os.path.basename(f) for f in entry.files] == [
        f"orch-nightly-{entry.key}.service", f"orch-nightly-{entry.key}.timer"]
    done = subprocess.run([systemd_analyze(), "verify", *entry.files], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    # Not a single complaint about our files (verify prints some for the host's own units).
    assert str(tmp_path / "units") not in done.stderr, done.stderr
    timer = open(entry.files[1]).read()
    assert "OnCalendar=*-*-* 02:30:00" in timer and "Persistent=true" in timer
    assert f"Unit=orch-nightly-{entry.key}.service" in timer
    cal = subprocess.run([systemd_analyze(), "calendar", "*-*-* 02:30:00"], capture_output=True,
                         text=True, timeout=30)
    assert cal.returncode == 0 and "Next elapse" in cal.stdout


def test_verify_catches_a_broken_unit(tmp_path):
    # The check above means something: verify does fail on a bad unit here.
    bad = tmp_path / "bad.service"
    bad.write_text("[Service]\nType=oneshot\nExecStart=relative/path\n")
    done = subprocess.run([systemd_analyze(), "verify", str(bad)], capture_output=True, text=True)
    assert done.returncode != 0


def split_exec_start(text: str) -> list[str]:
    """ExecStart= as systemd splits it (extract_first_word with UNQUOTE|CUNESCAPE, then
    %specifier and $VAR handling), for the escapes systemd_quote produces."""
    words, i = [], 0
    while i < len(text):
        while i < len(text) and text[i] in " \t":
            i += 1
        if i >= len(text):
            break
        word, quoted = [], False
        while i < len(text) and (quoted or text[i] not in " \t"):
            ch = text[i]
            if ch == '"':
                quoted = not quoted
            elif ch == "\\":
                i += 1
                word.append({"n": "\n", "t": "\t"}.get(text[i], text[i]))
            elif ch == "%":
                assert text[i + 1] == "%", f"unescaped specifier in {text!r}"
                word.append("%")
                i += 1
            elif ch == "$":
                assert text[i + 1] == "$", f"unescaped variable in {text!r}"
                word.append("$")
                i += 1
            else:
                word.append(ch)
            i += 1
        assert not quoted, f"unbalanced quote in {text!r}"
        words.append("".join(word))
    return words


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")) | st.sampled_from(
    list(" \t\"'\\%$;`")), min_size=1), min_size=1, max_size=6))
def test_systemd_quote_round_trips(argv):
    assert split_exec_start(" ".join(sched.systemd_quote(a) for a in argv)) == argv


def test_exec_start_carries_the_argv(tmp_path, playbook):
    entry = entry_for(playbook, extra=HOSTILE)
    units = sched.render_systemd(entry)
    service = units[f"orch-nightly-{entry.key}.service"]
    line = next(l for l in service.splitlines() if l.startswith("ExecStart="))
    argv = split_exec_start(line[len("ExecStart="):])
    assert argv == entry.argv
    assert argv[:3] == [sys.executable, "-m", "orchestrator"]
    assert argv[3:6] == ["nightly", os.path.abspath(playbook), "-t"]
    assert f"msg={HOSTILE[0]}" in argv and "msg=$(id)" in argv


# ------------------------------------------------------------------ cron
def test_cron_line_parses_and_runs_the_exact_argv(tmp_path, playbook):
    """Run the crontab command through /bin/sh as cron would: the argv must arrive intact."""
    entry = entry_for(playbook, kind="cron", at="7:05")
    entry.argv = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", *HOSTILE]
    entry.env = {"ORCH_DATA_DIR": str(tmp_path / "d 50%")}
    log = tmp_path / "cron 100%.log"
    line = sched.cron_line(entry, log=str(log))
    assert "\n" not in line
    parsed = sched.parse_cron_line(line)
    assert (parsed["minute"], parsed["hour"], parsed["dom"], parsed["month"], parsed["dow"]) == \
        ("5", "7", "*", "*", "*")
    assert parsed["marker"]["key"] == entry.key and parsed["marker"]["at"] == "07:05"
    # Every % in the command is escaped for cron (an unescaped one would end the command).
    assert not re.search(r"(?<!\\)%", line.split(" # orch-schedule ")[0])
    done = subprocess.run(["/bin/sh", "-c", parsed["command"]], timeout=60)
    assert done.returncode == 0
    assert json.loads(log.read_text().strip()) == HOSTILE


def test_cron_install_list_remove_keeps_other_lines(tmp_path, playbook):
    crontab = tmp_path / "crontab"
    crontab.write_text("MAILTO=me@example.invalid\n0 1 * * * /usr/bin/backup\n")
    runner = CliRunner()
    result = runner.invoke(main, ["schedule", "install", playbook, "--at", "03:15", "--cron",
                                  "--crontab-file", str(crontab), "-t", "sb1-200"])
    assert result.exit_code == 0, result.output
    again = runner.invoke(main, ["schedule", "install", playbook, "--at", "04:00", "--cron",
                                 "--crontab-file", str(crontab)])
    assert again.exit_code == 0, again.output
    lines = crontab.read_text().splitlines()
    assert lines[:2] == ["MAILTO=me@example.invalid", "0 1 * * * /usr/bin/backup"]
    assert len(lines) == 3 and lines[2].startswith("0 4 * * * ")      # replaced, not added
    listed = runner.invoke(main, ["schedule", "list", "--crontab-file", str(crontab), "--json"])
    items = json.loads(listed.output)
    assert [(i["kind"], i["at"], i["playbook"]) for i in items] == [("cron", "04:00", playbook)]
    removed = runner.invoke(main, ["schedule", "remove", playbook, "--crontab-file", str(crontab)])
    assert removed.exit_code == 0, removed.output
    assert crontab.read_text().splitlines() == lines[:2]
    gone = runner.invoke(main, ["schedule", "remove", playbook, "--crontab-file", str(crontab)])
    assert gone.exit_code == 1 and "no schedule" in gone.output


# ------------------------------------------------------------------ CLI, systemd to a folder
def test_systemd_install_list_remove_with_dest(tmp_path, playbook):
    dest = tmp_path / "units"
    runner = CliRunner()
    result = runner.invoke(main, ["schedule", "install", playbook, "--at", "02:30",
                                  "--dest", str(dest), "--json"])
    assert result.exit_code == 0, result.output
    entry = json.loads(result.output)
    assert entry["kind"] == "systemd-user" and len(entry["files"]) == 2
    system = runner.invoke(main, ["schedule", "install", playbook, "--at", "02:30", "--system",
                                  "--dest", str(dest), "--json"])
    assert json.loads(system.stdout)["kind"] == "systemd-system"
    assert "run `orch nightly` as root" in system.stderr   # said, even with --json
    assert "WantedBy=timers.target" in open(entry["files"][1]).read()
    listed = json.loads(runner.invoke(main, ["schedule", "list", "--dest", str(dest), "--json"]).output)
    assert [(i["playbook"], i["at"]) for i in listed] == [(playbook, "02:30")]
    screen = io.StringIO()   # an 80-column terminal: the files' paths go below the table
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(console, "out", console.make_console(file=screen, width=80,
                                                           force_terminal=True, color_system=None))
        runner.invoke(main, ["schedule", "list", "--dest", str(dest)])
    text = screen.getvalue()
    table, below = text.split("\n  ", 1)[0], "  " + text.split("\n  ", 1)[1]
    assert "FILES" not in table and ".timer" not in table and ".service" not in table
    assert below.splitlines() == [f"  {playbook}: {path}" for item in listed for path in item["files"]]
    removed = runner.invoke(main, ["schedule", "remove", playbook, "--dest", str(dest)])
    assert removed.exit_code == 0, removed.output
    assert os.listdir(dest) == []


@pytest.mark.parametrize("at", ["24:00", "2:3", "noon", "", "12:60", "1230"])
def test_bad_times_are_refused(at):
    with pytest.raises(ConfigError, match="HH:MM"):
        sched.parse_at(at)


def test_missing_playbook_is_refused(tmp_path):
    result = CliRunner().invoke(main, ["schedule", "install", str(tmp_path / "nope.yaml"),
                                       "--at", "02:00", "--dest", str(tmp_path)])
    assert result.exit_code == 2 and "no playbook" in result.output


def test_inventory_option_and_env_are_carried(tmp_path, playbook, monkeypatch):
    monkeypatch.setenv("ORCH_STORE", str(tmp_path / "s.sqlite"))
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    entry = sched.make_entry(playbook, "02:30", kind="cron", targets=[], extra_vars=[],
                             inventory="inventory.yaml")
    assert entry.argv[3:5] == ["-i", str(inventory)]
    assert entry.env["ORCH_STORE"] == str(tmp_path / "s.sqlite")
    assert entry.workdir == str(tmp_path)


@pytest.mark.parametrize("where", ["playbook", "extra_var", "workdir"])
def test_a_newline_cannot_inject_unit_directives(tmp_path, where):
    """A newline in the playbook's path once ended the unit's comment line and started a line
    of the caller's: refused wherever it comes from, for systemd and cron alike."""
    name = "dflash\nExecStartPre=touch pwned\n#.yaml" if where == "playbook" else "dflash.yaml"
    path = tmp_path / name
    path.write_text("name: dflash\n")
    workdir = str(tmp_path / "a\nb") if where == "workdir" else None
    extra = ["msg=one\rExecStartPre=/bin/true"] if where == "extra_var" else []
    entry = sched.make_entry(str(path), "02:30", kind="systemd-user", targets=[],
                             extra_vars=extra, inventory=None, workdir=workdir)
    for render in (sched.render_systemd, sched.cron_line):
        with pytest.raises(ConfigError, match="holds a control character"):
            render(entry)
    if where == "workdir":
        return
    for option, dest in (("--dest", tmp_path / "units"), ("--crontab-file", tmp_path / "crontab")):
        result = CliRunner().invoke(main, ["schedule", "install", str(path), "--at", "02:30",
                                           *(["-e", extra[0]] if extra else []), option, str(dest)])
        assert result.exit_code == 2 and "control character" in result.output, result.output
        assert not (dest.exists() and os.listdir(dest) if dest.is_dir() else dest.exists())


@pytest.mark.parametrize("timeout", ["6h\nExecStartPre=/bin/true", "6 hours; rm", "soon", "-1h", ""])
def test_a_bad_timeout_is_refused_before_anything_is_written(tmp_path, playbook, timeout):
    result = CliRunner().invoke(main, ["schedule", "install", playbook, "--at", "02:30",
                                       "--timeout", timeout, "--dest", str(tmp_path / "units")])
    assert result.exit_code == 2 and "expected a systemd time span" in result.output
    assert not os.path.exists(tmp_path / "units")


@pytest.mark.parametrize("timeout", ["6h", "90min", "1h 30min", "2.5h", "infinity", "3600"])
def test_good_timeouts_pass_systemd_analyze(tmp_path, playbook, timeout):
    entry = sched.install(entry_for(playbook), dest=str(tmp_path / "units"), timeout=timeout)
    assert f"TimeoutStartSec={timeout}\n" in open(entry.files[0]).read()
    done = subprocess.run([systemd_analyze(), "verify", *entry.files], capture_output=True,
                          text=True, timeout=60)
    assert str(tmp_path / "units") not in done.stderr, done.stderr
