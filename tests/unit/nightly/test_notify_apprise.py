"""orch nightly's apprise notifications with the real apprise library, to a JSON endpoint this
test serves on 127.0.0.1 (apprise's json:// service: it POSTs {"title", "message", "type"}).
The URLs carry a secret; it must reach the endpoint and nowhere else: not the console, not
orch's logging, not nightly.json, the reports or the run store."""

from __future__ import annotations

import builtins
import http.server
import json
import logging
import os
import threading

import pytest
from orchestrator.ground import paths
from orchestrator.ground.errors import ConfigError, ExitCode, OrchError
from orchestrator.nightly import notify_apprise
from orchestrator.nightly import rerun as nightly_mod
from orchestrator.nightly.rerun import NightlyConfig, NotifyConfig, load_config, nightly
from tests.support.nightly import Hook, fake_runner, run_numbers_from_one, seed_baseline, webhook  # noqa: F401

SECRET = "T0SECRET-xoxb-4242"


@pytest.fixture
def playbook(tmp_path):
    path = tmp_path / "dflash.yaml"
    path.write_text("name: dflash\n")
    return str(path)


@pytest.fixture
def endpoint():
    """A local JSON endpoint: (its host:port, the bodies it received)."""
    received = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, json.loads(body)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_port}", received
    server.shutdown()


def url_file(tmp_path, *urls):
    path = tmp_path / "apprise.txt"
    path.write_text("# the team's chat\n" + "\n".join(urls) + "\n")
    path.chmod(0o600)
    return str(path)


def everything_orch_wrote(outcome, capsys, caplog) -> str:
    captured = capsys.readouterr()
    texts = [captured.out, captured.err, caplog.text, json.dumps(outcome.notified)]
    folder = paths.run_dir(outcome.record.run_id)
    texts += [open(os.path.join(folder, name), errors="replace").read() for name in os.listdir(folder)]
    with open(os.path.join(paths.data_dir(), "runs.sqlite"), "rb") as handle:
        texts.append(handle.read().decode("latin-1"))
    return "\n".join(texts)


def test_a_regression_reaches_the_chat_through_apprise_and_the_secret_nowhere_else(
        playbook, tmp_path, endpoint, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    where, received = endpoint
    config_file = tmp_path / "nightly.yaml"
    config_file.write_text(f"notify:\n  apprise_config: {url_file(tmp_path, f'json://{where}/hook/{SECRET}')}\n")
    seed_baseline(playbook, tok_s=6000)
    outcome = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(tok_s=3000),
                      config=load_config(str(config_file)))
    assert outcome.exit_code == ExitCode.REGRESSION
    assert [(n["ok"], n["to"]) for n in outcome.notified] == [
        (True, f"apprise ({tmp_path}/apprise.txt) target 1 (JSON)")]
    path, body = received[0]
    assert path == f"/hook/{SECRET}"
    assert body["title"] == "orch nightly dflash.yaml: REGRESSION" and body["type"] == "failure"
    lines = body["message"].splitlines()
    assert lines[0].startswith("orch nightly dflash.yaml: REGRESSION - run ")
    assert any(line.startswith("regression: total throughput fell") for line in lines)
    assert lines[-1] == f"report: {outcome.reports['html']}"
    assert SECRET not in everything_orch_wrote(outcome, capsys, caplog)


def test_urls_from_a_variable_and_a_failed_target_is_a_warning_without_the_url(
        playbook, endpoint, monkeypatch, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    where, received = endpoint
    dead = f"json://127.0.0.1:9/{SECRET}"          # nothing listens on port 9
    monkeypatch.setenv("TEAM_APPRISE", f"json://{where}/ok/{SECRET}, {dead}")
    config = NightlyConfig(notify=NotifyConfig(apprise=[notify_apprise.AppriseSource(env="TEAM_APPRISE")]))
    outcome = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(), config=config)
    assert outcome.exit_code == 0
    assert [n["ok"] for n in outcome.notified] == [True, False]
    assert received[0][1]["type"] == "success" and received[0][1]["title"].endswith(": OK")
    failed = outcome.notified[1]
    assert failed["to"] == "apprise ($TEAM_APPRISE) target 2 (JSON)"
    assert 'APPRISE_URLS="$TEAM_APPRISE" apprise -vv' in failed["error"]
    written = everything_orch_wrote(outcome, capsys, caplog)
    assert "notification to apprise ($TEAM_APPRISE) target 2 (JSON) failed" in written
    assert SECRET not in written


def test_without_apprise_the_webhook_still_goes_and_apprise_says_how_to_install_it(
        playbook, tmp_path, webhook, monkeypatch, capsys):
    real_import = builtins.__import__

    def no_apprise(name, *args, **kw):
        if name == "apprise" or name.startswith("apprise."):
            raise ImportError("No module named 'apprise'")
        return real_import(name, *args, **kw)
    monkeypatch.setattr(builtins, "__import__", no_apprise)
    config = NightlyConfig(notify=NotifyConfig(
        webhooks=[webhook + "/hook"],
        apprise=[notify_apprise.AppriseSource(path=url_file(tmp_path, f"json://127.0.0.1:9/{SECRET}"))]))
    outcome = nightly(playbook, targets=[], extra_vars={}, run=fake_runner(), config=config)
    assert outcome.exit_code == 0 and [n["ok"] for n in outcome.notified] == [True, False]
    assert Hook.received and Hook.received[0][2]["status"] == "ok"
    assert "apprise is not installed (pip install 'orch[notify]')" in capsys.readouterr().err


def test_apprise_config_is_checked_when_read(tmp_path, capsys):
    config_file = tmp_path / "nightly.yaml"
    config_file.write_text("notify:\n  apprise_config: missing.txt\n")
    with pytest.raises(ConfigError, match="missing.txt: no such file"):
        load_config(str(config_file))
    config_file.write_text("notify:\n  apprise_env: 'slack://T0/B0/XXXX'\n")
    with pytest.raises(ConfigError, match="is not a variable name") as error:
        load_config(str(config_file))
    assert "XXXX" not in str(error.value).replace("'slack://T0/B0/XXXX'", "")
    urls = tmp_path / "urls.txt"
    urls.write_text(f"json://127.0.0.1:9/{SECRET}\n")
    urls.chmod(0o644)
    config_file.write_text("notify:\n  apprise_config: urls.txt\n")      # beside nightly.yaml
    config = load_config(str(config_file))
    assert config.notify.apprise[0].path == str(urls)
    assert "other users can read it: chmod 600" in capsys.readouterr().err


def test_a_line_apprise_does_not_know_is_named_by_its_position(playbook, tmp_path):
    source = notify_apprise.AppriseSource(path=url_file(tmp_path, f"nosuchscheme://{SECRET}"))
    results = notify_apprise.send(source, {"status": "ok", "text": "orch nightly x: OK - run r"})
    assert results[0]["ok"] is False and "not a URL apprise knows" in results[0]["error"]
    assert SECRET not in json.dumps(results)


def test_the_chat_message_is_bounded():
    summary = {"status": "failed", "text": "orch nightly x: FAILED - run r, verdict failed",
               "findings": [f"sig{i}: " + "x" * 1000 for i in range(300)],
               "environment": [f"t: pkg{i} 1 -> 2" for i in range(30)], "report_html": "/r.html"}
    title, body = notify_apprise.chat_message(summary)
    lines = body.splitlines()
    assert title == "orch nightly x: FAILED" and len(lines) == notify_apprise.MAX_BODY_LINES
    assert max(map(len, lines)) <= notify_apprise.MAX_LINE and "more lines in the report" in lines[-1]


def test_a_run_that_cannot_start_reaches_apprise_too(playbook, tmp_path, endpoint):
    where, received = endpoint
    source = notify_apprise.AppriseSource(path=url_file(tmp_path, f"json://{where}/{SECRET}"))
    nightly_mod.notify_error(playbook, OrchError("no such target sb9-999"),
                             NotifyConfig(apprise=[source]))
    assert received[-1][1]["title"] == "orch nightly dflash.yaml: ERROR"
    assert "error: no such target sb9-999" in received[-1][1]["message"]
