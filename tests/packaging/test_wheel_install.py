"""orch as a user installs it: the built wheel, non-editable, in a fresh venv. The report and
schedule templates must come from inside the installed package (the repository's templates/
is mapped there by pyproject.toml), so `orch report`, `orch schedule install --dest` and
`orch nightly` work with no checkout around. The wheel carries no test bed and no test data:
the sandbox is a distribution of its own (sandbox/), and without it `orch sandbox up` says
how to get it.

Costs: building the wheel and installing it into a fresh venv, a few seconds; no package index
is needed (the dependencies are this environment's own)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile

import pytest

from orchestrator.cli.commands.sandbox import SANDBOX_NOT_INSTALLED_EXIT

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The stand-in trainer's log format (docs/design/dflash-workload.md): two drafters, then the summary line.
TRAINER = ("import time\n"
           "for step in range(1, 4):\n"
           "    for d in range(2):\n"
           "        print(f'drafter={d} step={step} loss={3.0 / step:.2f} tok_s=1000', flush=True)\n"
           "    time.sleep(0.2)\n"
           "for d in range(2):\n"
           "    print(f'drafter={d} done steps=3 loss=1.00 tok_s=1000', flush=True)\n"
           "print('summary status=ok drafters=2 ok=2 failed=0 total_tok_s=2000', flush=True)\n")


# The sandbox (its package, the emulated Proxmox tools, the host set-up script) and test data.
SANDBOX_FILES = {"pct", "pct.py", "pvesh", "pveproxy", "pvelib.py", "pvetasks.py", "pvefiles.py",
                 "host-setup.sh"}


def is_test_only(name: str) -> bool:
    top, base = name.split("/")[0], name.rsplit("/", 1)[-1]
    return (top in ("orch_sandbox", "tests") or top.startswith("orch_sandbox-")
            or name.startswith("orchestrator/sandbox/") or base in SANDBOX_FILES
            or "synthetic" in name)


# What a build leaves in a checkout: setuptools puts whatever is in build/lib into the
# wheel, so a wheel is built from a clean copy of the checkout, as on a fresh clone.
BUILD_LEFTOVERS = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__")
# ... and what a developer's checkout holds at its top that a clone does not.
LOCAL_ONLY = {".git", ".venv", ".pytest_cache", ".hypothesis", "runs", ".whl", ".gl"}


def clean_copy(source: str, dest) -> str:
    def leftovers(folder, names):
        local = LOCAL_ONLY & set(names) if os.path.samefile(folder, REPO) else set()
        return set(BUILD_LEFTOVERS(folder, names)) | local
    shutil.copytree(source, dest, ignore=leftovers)
    return str(dest)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    work = tmp_path_factory.mktemp("wheel")
    source = clean_copy(REPO, work / "src")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                            str(work / "dist"), source], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = next((work / "dist").glob("orch-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "orchestrator/templates/report.html.j2" in names
    assert "orchestrator/templates/orch-nightly.timer.j2" in names
    test_only = [name for name in names if is_test_only(name)]
    assert test_only == [], f"test bed or test data in the wheel: {test_only}"

    env_dir = work / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    # orch's dependencies (paramiko, click, jinja2, ...) come from this test's own environment,
    # so no package index is needed: a path line in a .pth adds its site-packages after the
    # fresh venv's own, and its .pth files (the editable orch among them) are not run.
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(purelib, "orch-test-deps.pth"), "w") as handle:
        handle.write(sysconfig.get_paths()["purelib"] + "\n")
    return {"orch": str(env_dir / "bin" / "orch"), "python": python, "work": work}


def run_orch(installed, *args, cwd):
    # Run from a folder with no templates/ around, with a data dir of its own.
    env = {**os.environ, "ORCH_DATA_DIR": str(installed["work"] / "data")}
    for name in ("ORCH_STORE", "ORCH_TEMPLATES", "ORCH_INVENTORY", "PYTHONPATH"):
        env.pop(name, None)
    return subprocess.run([installed["orch"], *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_installed_wheel_runs_nightly_report_and_schedule(installed, tmp_path):
    located = subprocess.run([installed["orch"].replace("/orch", "/python"), "-c",
                              "import orchestrator; print(orchestrator.__file__)"],
                             cwd=tmp_path, capture_output=True, text=True)
    assert located.stdout.startswith(str(installed["work"] / "venv")), located   # not the checkout

    (tmp_path / "trainer.py").write_text(TRAINER)
    (tmp_path / "inventory.yaml").write_text(textwrap.dedent("""
        hosts:
          here: {transport: local}
        containers:
          dev: {host: here}
        default_target: dev
        """))
    (tmp_path / "small.yaml").write_text(textwrap.dedent(f"""
        name: small
        targets: [dev]
        steps:
          - launch:
              command: [{sys.executable}, {tmp_path / 'trainer.py'}]
              venv: false
          - monitor: {{hang_after: 60, gpu_every: 0, expect_drafters: 2}}
        """))

    nightly = run_orch(installed, "-i", "inventory.yaml", "nightly", "small.yaml", cwd=tmp_path)
    assert "Traceback" not in nightly.stdout + nightly.stderr, nightly.stderr[-3000:]
    assert nightly.returncode == 0, nightly.stdout[-3000:] + nightly.stderr[-3000:]

    report = run_orch(installed, "report", "last", "--html", str(tmp_path / "r.html"),
                      "--md", "-", cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-3000:]
    assert "small" in report.stdout and (tmp_path / "r.html").read_text().startswith("<!")

    units = tmp_path / "units"
    schedule = run_orch(installed, "schedule", "install", "small.yaml", "--at", "02:30",
                        "--dest", str(units), cwd=tmp_path)
    assert schedule.returncode == 0, schedule.stderr[-3000:]
    timer = next(units.glob("*.timer")).read_text()
    assert "OnCalendar=*-*-* 02:30:00" in timer


def test_installed_wheel_without_the_sandbox_says_how_to_get_it(installed, tmp_path):
    absent = subprocess.run([installed["python"], "-c", "import orch_sandbox"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert absent.returncode != 0 and "No module named 'orch_sandbox'" in absent.stderr

    up = run_orch(installed, "sandbox", "up", cwd=tmp_path)
    assert up.returncode == SANDBOX_NOT_INSTALLED_EXIT == 2, up.stdout + up.stderr
    assert "Traceback" not in up.stdout + up.stderr
    message = " ".join(up.stderr.split())
    assert message.startswith("error: the sandbox is not installed.")
    assert "pip install -e . -e ./sandbox" in message

    listing = run_orch(installed, "--help", cwd=tmp_path)
    assert listing.returncode == 0 and "sandbox" in listing.stdout


def test_installed_wheels_agent_stamps_every_file_and_the_record(installed, tmp_path):
    """A stale agent must see any reinstall: every file of the installed package (payloads,
    templates) and the distribution's RECORD are stamped (docs/guide/agent.md, "Which code")."""
    probe = ("import json, os\nfrom orchestrator.agentd import server\n"
             "package = os.path.dirname(os.path.dirname(server.__file__))\n"
             "print(json.dumps([os.path.relpath(p, package) for p in server._code_stamps()]))")
    done = subprocess.run([installed["python"], "-c", probe], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    stamped = json.loads(done.stdout)
    assert {"payloads/reaper.py", "templates/orch-nightly.service.j2", "targets/proxmox.py",
            "playbook/engine.py", "playbook/steps/monitor.py"} <= set(stamped)
    assert any(name.startswith("../orch-") and name.endswith(".dist-info/RECORD") for name in stamped)


def test_sandbox_wheel_carries_the_emulated_tools(tmp_path):
    # The sandbox copies its bin/ into each host at `up`: a sandbox wheel without one of
    # these files (package data, not a package) would build hosts with no pct or pvesh.
    source = clean_copy(os.path.join(REPO, "sandbox"), tmp_path / "src")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                            str(tmp_path), source], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = next(tmp_path.glob("orch_sandbox-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    shipped = {name.rsplit("/", 1)[-1] for name in names if name.startswith("orch_sandbox/")}
    assert SANDBOX_FILES | {"__init__.py", "core.py"} <= shipped, SANDBOX_FILES - shipped
    assert not any(name.startswith("orchestrator/") for name in names)
