"""Makes the explain corpus (tests/fixtures/explain_corpus): real failures of real libraries,
captured as orch captures them, each labelled with the exception that caused it and whether
shared state is involved. benchmarks/explain_corpus.py measures `orch explain` on it.

    python tests/corpus/make_explain_corpus.py                 # every case this machine can make
    python tests/corpus/make_explain_corpus.py --only ddp-raise --only race-node-meta
    python tests/corpus/make_explain_corpus.py --list
    python tests/corpus/make_explain_corpus.py --cuda OUT       # on a machine with a GPU: its cases into OUT
    python tests/corpus/make_explain_corpus.py --import-cuda OUT  # ... and into the corpus here

Run it with the worktree's venv python (it runs `python -m orchestrator` for the cases made
through orch). How each case is made (nothing is written by hand: every log is a real run's):
- `python`: the workload run as orch's launcher runs a command (stdout and stderr into one
  output.log, python unbuffered), with the cached torch 2.13.0 CPU venv (tests/support/torchenv.py) or
  the Trainer venv on top of it (tests/trainer/realenv.py).
- `torchrun`: `python -m torch.distributed.run --nproc-per-node 2 --log-dir RUN/ranks
  --redirects 3 ...`, the argv orch's launch step builds (orchestrator/watch/torchrun.py), gloo
  on CPU: output.log holds torchrun's own words, ranks/ each rank's stdout and stderr (and the
  error file of a worker under @record); or `--tee 3`, one stream, as people run it by hand.
- `orch`: `orch run` of a playbook on a local target (tests/corpus/playbooks/corpus-run.yaml,
  playbooks/dflash-demo.yaml) or on the sandbox's two nodes (playbooks/ddp-two-nodes.yaml,
  under the sandbox lock): the run record, and each launch's files as they were in the target.
- `cuda`: made on a machine with an NVIDIA GPU by `--cuda` (its own torch), imported here.

Workloads run in SCRATCH/<case>/, a folder of their own, so their frames' paths name no
checkout; the manifest keeps each file's original path and the workload scripts' paths (the
benchmark puts the scripts back there, so that their frames have source).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.support.torchenv import torch_venv  # noqa: E402

CORPUS = REPO / "tests" / "fixtures" / "explain_corpus"
WORKLOADS = Path(__file__).resolve().parent / "workloads"
PLAYBOOK = Path(__file__).resolve().parent / "playbooks" / "corpus-run.yaml"
SCRATCH = Path("/tmp/orch-corpus")
TRAINER = REPO / "playbooks" / "files" / "train_drafters.py"
MAX_FILE = 256 * 1024          # a kept log's end (explain reads a log's end too)
TINY_DRAFTERS = ["--batch", "2", "--seq", "64", "--d-model", "32", "--layers", "1", "--heads", "2",
                 "--block-size", "16", "--vocab", "64", "--devices", "cpu", "--cpu-threads", "1",
                 "--drafters", "3", "--steps", "4", "--max-seconds", "120"]


@dataclass
class Case:
    name: str
    category: str                 # single | threads | multi-rank | race | hang
    make: Optional[Callable]      # (case, folder) -> facts about the run
    lead: dict                    # {exception, message, worker} | {signal, worker} | {hang} | {none}
    shared_state: bool = False
    state: str = ""               # a race's shared state: module.name
    target: str = "torch"         # the venv the log's frames are read in: torch | patched
    about: str = ""
    needs: str = ""               # "sandbox" | "cuda" | "" (this machine)


# ------------------------------------------------------------------ venvs
def torch_python() -> str:
    return os.path.join(torch_venv(), "bin", "python")


def trainers_python() -> str:
    from tests.trainer.realenv import trainers_venv
    return str(trainers_venv(Path(torch_python())) / "bin" / "python")


def venv_copy(root: Path) -> Path:
    """A hard-link copy of the torch venv: orch's patch writes by rename, never through a
    link into the shared venv."""
    if root.exists():
        shutil.rmtree(root)
    subprocess.run(["cp", "-al", torch_venv(), str(root)], check=True)
    return root


def patched_python(root: Path) -> str:
    """A copy of the torch venv with orch's fx-threads patch applied."""
    venv_copy(root)
    data = Path(tempfile.mkdtemp(prefix="corpus-patch-"))
    done = orch(local_inventory(data / "inventory.yaml", {"dev": str(root)}),
                "patch", "fx-threads", "apply", "-t", "dev", data=data)
    shutil.rmtree(data, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"fx-threads apply failed: {done.stdout}{done.stderr}")
    return str(root / "bin" / "python")


# ------------------------------------------------------------------ running workloads
def workdir(case: Case) -> Path:
    folder = SCRATCH / case.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def put_script(folder: Path, name: str) -> Path:
    script = folder / name
    shutil.copy(WORKLOADS / name, script)
    return script


def environment(extra: Optional[dict] = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "TORCHELASTIC_"))}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(extra or {}))
    return env


def run_logged(argv: list[str], folder: Path, timeout: float, env: Optional[dict] = None) -> int:
    """As orch's launcher runs a command: both streams into one output.log."""
    with open(folder / "output.log", "wb") as log:
        try:
            return subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=folder,
                                  env=environment(env), timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return -signal.SIGKILL


def python_case(script: str, *args: str, python: Callable = torch_python, timeout: float = 300) -> Callable:
    def make(case: Case, folder: Path) -> dict:
        argv = [python(), str(put_script(folder, script)), *args]
        return {"how": "python", "argv": argv, "exit_code": run_logged(argv, folder, timeout)}
    return make


def torchrun_case(script: str, *args: str, python: Callable = torch_python, tee: bool = False,
                  timeout: float = 300) -> Callable:
    """torchrun with 2 ranks, as orch's launch step runs it (one log per rank), or with
    --tee 3 (every rank's lines into one stream, prefixed) as people run it by hand."""
    def make(case: Case, folder: Path) -> dict:
        logs = ["--tee", "3"] if tee else ["--log-dir", str(folder / "ranks"), "--redirects", "3"]
        argv = [python(), "-m", "torch.distributed.run", "--nproc-per-node", "2", *logs,
                str(put_script(folder, script)), *args]
        return {"how": "torchrun", "argv": argv, "exit_code": run_logged(argv, folder, timeout)}
    return make


def drafters_case(*args: str, patched: bool = False) -> Callable:
    """The stand-in DFlash trainer (drafter threads, torch.compile(flex_attention))."""
    def make(case: Case, folder: Path) -> dict:
        python = patched_python(SCRATCH / "patched-venv") if patched else torch_python()
        trainer = folder / "train_drafters.py"
        shutil.copy(TRAINER, trainer)
        argv = [python, str(trainer), *TINY_DRAFTERS, *args]
        code = run_logged(argv, folder, 400, {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor")})
        shutil.rmtree(folder / "inductor", ignore_errors=True)
        if patched:
            shutil.rmtree(SCRATCH / "patched-venv", ignore_errors=True)
        return {"how": "python", "argv": argv, "exit_code": code,
                "torch": "fx-threads patch applied" if patched else "as installed"}
    return make


# ------------------------------------------------------------------ through orch itself
def orch(inventory: Path, *args: str, data: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = environment({"ORCH_DATA_DIR": str(data), "ORCH_AGENT_DIR": str(data / "agent"),
                       "COLUMNS": "200"})
    return subprocess.run([sys.executable, "-m", "orchestrator", "--no-agent", "-i", str(inventory), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def local_inventory(path: Path, containers: dict[str, str]) -> Path:
    lines = ["hosts:", "  here: {transport: local}", "containers:"]
    lines += [f"  {name}: {{host: here, venv: '{venv}'}}" for name, venv in containers.items()]
    path.write_text("\n".join(lines + [f"default_target: {next(iter(containers))}", ""]))
    return path


def orch_case(script: str, *args: str, torchrun: bool = False, hang_after: int = 10) -> Callable:
    """`orch run` of the corpus playbook on this machine: the record and each launch's files."""
    def make(case: Case, folder: Path) -> dict:
        path = put_script(folder, script)
        data = Path(tempfile.mkdtemp(prefix="corpus-data-"))
        inventory = local_inventory(data / "inventory.yaml", {"dev": torch_venv()})
        command = json.dumps([torch_python(), str(path), *args])
        extra = ["-e", "torchrun={nproc_per_node: 2}"] if torchrun else []
        done = orch(inventory, "run", str(PLAYBOOK), "-e", f"command={command}", "-e", f"cwd={folder}",
                    "-e", f"hang_after={hang_after}", *extra, data=data)
        return keep_run(folder, data, done)
    return make


def demo_case(case: Case, folder: Path) -> dict:
    """playbooks/dflash-demo.yaml for real: the race, the patch, the relaunch (on a copy of
    the torch venv, which the demo patches)."""
    data = Path(tempfile.mkdtemp(prefix="corpus-data-"))
    venv = venv_copy(SCRATCH / "demo-venv")
    inventory = local_inventory(data / "inventory.yaml", {"dev": str(venv)})
    done = orch(inventory, "run", "playbooks/dflash-demo.yaml", "-e", "steps=20", "-e", "log_every=5",
                "-e", "max_seconds=300", data=data)
    shutil.rmtree(venv, ignore_errors=True)
    return keep_run(folder, data, done)


def keep_run(folder: Path, data: Path, done: subprocess.CompletedProcess,
             roots: Optional[dict] = None) -> dict:
    """The run's record and, of each launch, the files explain reads in the target (its
    output.log, each rank's logs and error files), into folder/targets/<target>/. ROOTS: where
    each target's file system is seen from here (a container's rootfs; this machine's: /)."""
    shown = orch(local_inventory(data / "show-inventory.yaml", {"dev": torch_venv()}),
                 "runs", "show", "last", "--json", data=data)
    if shown.returncode != 0:
        raise RuntimeError(f"orch run left no record:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    # the record as the run store keeps it (RunRecord.to_dict()), its metric series left out
    record = {key: value for key, value in json.loads(shown.stdout).items()
              if key not in ("metric_points", "throughput", "pinned", "controller_state")}
    record["metrics"] = []
    (folder / "record.json").write_text(scrub(json.dumps(record, indent=1) + "\n"))
    originals = []
    for step in record["steps"]:
        run_dir = (step.get("data") or {}).get("run_dir")
        if step["kind"] != "launch" or not run_dir:
            continue
        seen = Path((roots or {}).get(step["target"], "/")) / run_dir.lstrip("/")
        for source in [seen / "output.log", *sorted(p for p in seen.glob("ranks/**/*") if p.is_file())]:
            if source.is_file():
                dest = folder / "targets" / step["target"] / Path(run_dir).name / source.relative_to(seen)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(source, dest)
                originals.append(f"{dest.relative_to(folder)}\t{run_dir}/{source.relative_to(seen)}")
        shutil.rmtree(seen.parent, ignore_errors=True)      # the launcher's folder of this run
    (folder / "originals.txt").write_text("\n".join(originals) + "\n")
    (folder / "orch-run.txt").write_text(scrub(done.stdout[-20000:]))
    shutil.rmtree(data, ignore_errors=True)
    return {"how": "orch", "exit_code": done.returncode, "verdict": record.get("verdict")}


def scrub(text: str) -> str:
    """The checkout's own path out of what orch printed and recorded (a playbook's path)."""
    return text.replace(str(REPO) + "/", "")


def sandbox_case(fault: str) -> Callable:
    """playbooks/ddp-two-nodes.yaml over sb1-200 and sb2-200 (real LXC containers on two hosts,
    gloo between them), the corpus's DDP workload with one fault on rank 1 (sb2-200's)."""
    def make(case: Case, folder: Path) -> dict:
        import fcntl

        import orch_sandbox

        from tests.integration.torch_seed import container_root, remove_venv, seed_torch_venv
        nodes = [("sb1", 200), ("sb2", 200)]
        with open("/tmp/orch-sandbox.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)       # the sandbox is one for every helper
            sandbox = orch_sandbox.up()
            for host, vmid in nodes:
                seed_torch_venv(sandbox, host, vmid, dest="corpus-venv")
                shutil.copy(WORKLOADS / "ddp_faults.py", Path(container_root(sandbox, host, vmid)) / "ddp_faults.py")
            data = Path(tempfile.mkdtemp(prefix="corpus-data-"))
            try:
                done = orch(Path(sandbox.inventory_path), "run", "playbooks/ddp-two-nodes.yaml",
                            "-t", "sb1-200", "-t", "sb2-200", "-e", "venv=/root/corpus-venv",
                            "-e", "script=/root/ddp_faults.py", "-e", "hang_after=60",
                            "-e", f"trainer_args=[--fault, {fault}, --steps, 60]", data=data)
                roots = {f"{host}-{vmid}": str(Path(container_root(sandbox, host, vmid)).parent)
                         for host, vmid in nodes}
                return keep_run(folder, data, done, roots)
            finally:
                for host, vmid in nodes:
                    remove_venv(sandbox, host, vmid, dest="corpus-venv")
                    (Path(container_root(sandbox, host, vmid)) / "ddp_faults.py").unlink(missing_ok=True)
    return make


# ------------------------------------------------------------------ the cases
def exception(kind: str, message: str, worker: str = "") -> dict:
    """What leads: the exception's type as printed, a part of its message, whose it is."""
    return {"exception": kind, "message": message, **({"worker": worker} if worker else {})}


def single(bug: str, kind: str, message: str, about: str) -> Case:
    return Case(f"single-{bug}", "single", python_case("single_bugs.py", "--bug", bug),
                exception(kind, message), about=about)


def hf(bug: str, kind: str, message: str, about: str) -> Case:
    return Case(f"hf-{bug}", "single", python_case("hf_bugs.py", "--bug", bug, python=trainers_python),
                exception(kind, message), about=about)


RANK1 = "injected failure on rank 1 at step 30"
FX_ERROR = "Detected that you are using FX to symbolically trace a dynamo-optimized function"
FX_FLAG = "torch.fx._symbolic_trace._is_fx_tracing_flag"
CASES = [
    single("config-keyerror", "KeyError", "'betas'", "a key missing from the run's JSON config"),
    single("shape-mismatch", "RuntimeError", "mat1 and mat2 shapes cannot be multiplied (16x31 and 32x64)",
           "inputs of the wrong width into nn.Linear"),
    single("cpu-oom", "RuntimeError", "DefaultCPUAllocator: can't allocate memory", "a 64 TiB tensor on CPU"),
    single("file-not-found", "FileNotFoundError",
           "[Errno 2] No such file or directory: './checkpoints/step-1000.pt'",
           "torch.load of a checkpoint that is not there"),
    single("dtype-mismatch", "RuntimeError", "mat1 and mat2 must have the same dtype, but got Double and Float",
           "float64 inputs into a float32 model"),
    single("target-out-of-range", "IndexError", "Target 8 is out of bounds.", "labels past the classes"),
    single("anomaly-nan", "RuntimeError", "Function 'SqrtBackward0' returned nan values in its 0th output.",
           "detect_anomaly() catching a nan in backward"),
    single("backward-twice", "RuntimeError", "Trying to backward through the graph a second time",
           "a second backward through a freed graph"),
    single("inplace-autograd", "RuntimeError",
           "one of the variables needed for gradient computation has been modified by an inplace operation",
           "an in-place change of a tensor autograd saved (the word 'modified', one thread)"),
    single("dataloader-worker", "KeyError", "'labels'",
           "a Dataset's KeyError in a DataLoader worker process, re-raised in the main process"),
    single("fullgraph-graph-break", "torch._dynamo.exc.Unsupported", "Data-dependent branching",
           "torch.compile(fullgraph=True) on data-dependent control flow (dynamo's module state on the stack)"),
    hf("no-labels", "ValueError", "The model did not return a loss from the inputs",
       "HF Trainer on a dataset without labels"),
    hf("removed-argument", "TypeError",
       "TrainingArguments.__init__() got an unexpected keyword argument 'evaluation_strategy'",
       "a TrainingArguments keyword transformers 5 no longer has"),
    hf("import-error", "ImportError", "cannot import name 'GPT2FlashModel' from 'transformers'",
       "an import of a class that does not exist"),
    hf("seq-too-long", "IndexError", "index out of range in self",
       "HF Trainer on sequences past the model's n_positions (the position embedding's lookup)"),
    Case("cuda-oom", "single", None, exception("torch.OutOfMemoryError", "CUDA out of memory."),
         about="a real CUDA out-of-memory on an H200", needs="cuda"),
    Case("cuda-device-assert", "single", None,
         exception("torch.AcceleratorError", "CUDA error: device-side assert triggered"),
         about="embedding ids past the vocabulary on an H200: the kernel's assert", needs="cuda"),
    # -- several threads fail, and no race is involved
    Case("threads-same-keyerror", "threads", python_case("thread_bugs.py"),
         exception("KeyError", "'betas'"),
         about="three worker threads fail on the same missing key of a module-level config the main "
               "thread filled at start-up (a process-wide dict written at run time, no race)"),
    # -- multi-rank: a rank fails, the others follow
    Case("ddp-raise", "multi-rank", torchrun_case("ddp_faults.py", "--fault", "raise"),
         exception("RuntimeError", RANK1, "rank 1"),
         about="rank 1 raises; rank 0 loses its peer (gloo), torchrun SIGTERMs it"),
    Case("ddp-raise-tee", "multi-rank", torchrun_case("ddp_faults.py", "--fault", "raise", tee=True),
         exception("RuntimeError", RANK1, "rank 1"),
         about="the same with --tee 3: every rank's lines in one stream, [defaultN]:[rankN]: prefixes"),
    Case("ddp-keyerror-record", "multi-rank", torchrun_case("ddp_faults.py", "--fault", "keyerror", "--record"),
         exception("KeyError", "'scheduler'", "rank 1"),
         about="main under @record: both ranks write error files; torchrun's table quotes them"),
    Case("ddp-rank0-raises", "multi-rank",
         torchrun_case("ddp_faults.py", "--fault", "raise", "--fault-rank", "0"),
         exception("RuntimeError", "injected failure on rank 0 at step 30", "rank 0"),
         about="rank 0 raises, rank 1 loses its peer"),
    Case("ddp-sigkill", "multi-rank", torchrun_case("ddp_faults.py", "--fault", "kill"),
         {"signal": "SIGKILL", "worker": "rank 1"},
         about="rank 1 killed with SIGKILL (as the OOM killer does); rank 0 loses its peer"),
    Case("hf-ddp-rank1-collator", "multi-rank",
         torchrun_case("hf_bugs.py", "--bug", "rank1-collator", python=trainers_python),
         exception("KeyError", "'labels'", "rank 1"),
         about="HF Trainer under torchrun (DDP, gloo): rank 1's collator fails; rank 0 loses its peer "
               "in accelerate's gather"),
    Case("two-nodes-raise", "multi-rank", sandbox_case("raise"), exception("RuntimeError", RANK1, "rank 1"),
         about="two sandbox containers on two hosts, one node each: rank 1 (sb2-200) raises; sb1-200's "
               "rank 0 loses its peer, orch stops sb1-200", needs="sandbox"),
    Case("two-nodes-keyerror", "multi-rank", sandbox_case("keyerror"), exception("KeyError", "'scheduler'", "rank 1"),
         about="the same with a KeyError on sb2-200's rank", needs="sandbox"),
    Case("two-nodes-sigkill", "multi-rank", sandbox_case("kill"), {"signal": "SIGKILL", "worker": "rank 1"},
         about="sb2-200's rank killed with SIGKILL", needs="sandbox"),
    # -- races: process-wide state shared by threads
    Case("race-fx-flag", "race", drafters_case("--race"), exception("RuntimeError", FX_ERROR),
         shared_state=True, state=FX_FLAG,
         about="the stand-in trainer's three drafters and an open FX trace (unpatched torch)"),
    Case("race-fx-flag-after-patch", "race", drafters_case("--race"), exception("RuntimeError", FX_ERROR),
         shared_state=True, state=FX_FLAG, target="patched",
         about="the same, explained after orch's fx-threads patch went in (the source that ran is the backup)"),
    Case("race-fx-flag-patched-relaunch", "race", drafters_case("--race", patched=True), {"none": True},
         target="patched", about="the race switch on a patched torch: the drafters train, nothing to explain"),
    Case("demo-playbook", "race", demo_case, exception("RuntimeError", FX_ERROR), shared_state=True,
         state=FX_FLAG, target="patched",
         about="orch run playbooks/dflash-demo.yaml (race, patch, relaunch ok), explained afterwards"),
    Case("race-node-meta", "race", python_case("races.py", "--race", "node-meta"),
         exception("KeyError", "'custom'", "annotator"), shared_state=True, state="torch.fx.traceback.current_meta",
         about="torch.fx.traceback's current_meta rebound by one thread under another's annotate()"),
    Case("race-trace-patcher", "race", python_case("races.py", "--race", "trace-patcher"),
         exception("NameError", "module is not installed as a submodule", "trainer-1"), shared_state=True,
         state="torch.fx._symbolic_trace.CURRENT_PATCHER",
         about="FX's process-wide patch of nn.Module.__call__ while another thread traces"),
    Case("race-stance", "race", python_case("races.py", "--race", "stance"),
         exception("RuntimeError", "Detected recompile when torch.compile stance is 'fail_on_recompile'", "trainer-1"),
         shared_state=True, state="torch._dynamo.eval_frame._stance",
         about="torch.compiler.set_stance in one thread (the module global _stance) fails another's first compile"),
    Case("race-warnings-filter", "race", python_case("races.py", "--race", "warnings-filter"),
         exception("UserWarning", "To copy construct from a tensor", "trainer-1"), shared_state=True,
         state="warnings.filters",
         about="warnings.catch_warnings() in one thread turns another thread's torch warning into an exception"),
    # -- hangs
    Case("hang-drafter-fails-others-block", "hang", drafters_case("--fail-drafter", "1", "--max-seconds", "60"),
         exception("RuntimeError", "drafter 1 failed at step 1 (--fail-drafter)", "drafter-1"),
         about="one drafter raises holding a lock the others need; the trainer's watchdog ends the run"),
    Case("hang-deadlock-orch-stopped", "hang", orch_case("hangs.py", "--hang", "deadlock"), {"hang": True},
         about="two threads deadlocked on two locks; orch's monitor stops the run as hung"),
    Case("hang-faulthandler", "hang", python_case("hangs.py", "--hang", "faulthandler"), {"hang": True},
         about="a queue nobody fills; faulthandler's watchdog dumps every thread's stack and exits"),
    Case("hang-torchrun-barrier-orch-stopped", "hang", orch_case("hangs.py", "--hang", "barrier", torchrun=True),
         {"hang": True},
         about="under torchrun rank 1 never reaches the barrier rank 0 waits in; orch stops the job as hung"),
    Case("hang-collective-timeout", "hang", torchrun_case("ddp_faults.py", "--fault", "hang", "--timeout", "10"),
         exception("RuntimeError", "Timed out waiting", "rank 0"),
         about="rank 1 stops before a step; rank 0's all-reduce times out (gloo, 10 s): the first failure "
               "is rank 0's timeout, waiting for rank 1"),
]


# ------------------------------------------------------------------ the corpus on disk
def versions(python: str) -> dict:
    code = ("import json, platform, importlib.metadata as m\nout = {'python': platform.python_version()}\n"
            "for name in ('torch', 'transformers', 'accelerate'):\n    try: out[name] = m.version(name)\n"
            "    except Exception: pass\nprint(json.dumps(out))")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def keep_files(case: Case, folder: Path) -> list[dict]:
    """The run's files, each cut to its end, as [{path (in the corpus), bytes, original,
    target}]: an orch run's (targets/<target>/...) under their path in the target, a plain
    run's as the run wrote them (target: dev)."""
    dest = CORPUS / case.name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    originals = {}
    if (folder / "originals.txt").exists():
        for line in (folder / "originals.txt").read_text().splitlines():
            name, _, original = line.partition("\t")
            if name:
                originals[name] = original
    names = ["output.log", "record.json", "orch-run.txt"] if not originals else ["record.json", "orch-run.txt"]
    names += sorted(str(p.relative_to(folder)) for p in folder.glob("ranks/**/*") if p.is_file())
    names += sorted(originals)
    kept = []
    for name in names:
        source = folder / name
        if not source.is_file():
            continue
        data = source.read_bytes()
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(data[-MAX_FILE:])
        entry = {"path": name, "bytes": len(data)}
        if name in originals:
            entry.update(original=originals[name], target=name.split("/")[1])
        elif name not in ("record.json", "orch-run.txt"):
            entry.update(original=str(source), target="dev")
        kept.append(entry)
    return kept


def entry_of(case: Case, folder: Path, made: dict, scripts: dict) -> dict:
    return {"name": case.name, "category": case.category, "about": case.about, "lead": case.lead,
            "shared_state": case.shared_state, "state": case.state, "target": case.target,
            "made": {**made, "at": time.strftime("%Y-%m-%d")}, "scripts": scripts,
            "files": keep_files(case, folder)}


def make(case: Case) -> dict:
    folder = workdir(case)
    started = time.monotonic()
    facts = case.make(case, folder)
    facts.update(seconds=round(time.monotonic() - started, 1),
                 versions=versions(trainers_python() if "hf" in case.name else torch_python()))
    scripts = {str(folder / p.name): p.name for p in folder.glob("*.py") if (WORKLOADS / p.name).exists()}
    return entry_of(case, folder, facts, scripts)


def manifest() -> dict:
    path = CORPUS / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {"cases": []}


def update(entry: dict) -> None:
    data = manifest()
    data["cases"] = [c for c in data["cases"] if c["name"] != entry["name"]] + [entry]
    order = {case.name: index for index, case in enumerate(CASES)}
    data["cases"].sort(key=lambda c: order.get(c["name"], len(order)))
    data["about"] = ("made by tests/corpus/make_explain_corpus.py; measured by "
                     "benchmarks/explain_corpus.py (docs/benchmarks/explain.md)")
    CORPUS.mkdir(parents=True, exist_ok=True)
    (CORPUS / "manifest.json").write_text(json.dumps(data, indent=1) + "\n")


# ------------------------------------------------------------------ the GPU cases
def cuda_cases(out: Path) -> None:
    """On a machine with CUDA (its own python and torch): each GPU case's output.log and facts
    into OUT, to be imported with --import-cuda where the corpus is."""
    out.mkdir(parents=True, exist_ok=True)
    for case in [c for c in CASES if c.needs == "cuda"]:
        folder = workdir(case)
        script = put_script(folder, "cuda_bugs.py")
        code = run_logged([sys.executable, str(script), "--bug", case.name], folder, 300)
        shutil.copy(folder / "output.log", out / f"{case.name}.log")
        (out / f"{case.name}.json").write_text(json.dumps({"exit_code": code, "script": str(script),
                                                           "versions": versions(sys.executable)}))


def import_cuda(out: Path) -> None:
    for case in [c for c in CASES if c.needs == "cuda"]:
        facts = json.loads((out / f"{case.name}.json").read_text())
        folder = workdir(case)
        shutil.copy(out / f"{case.name}.log", folder / "output.log")
        update(entry_of(case, folder, {"how": "cuda", "exit_code": facts["exit_code"],
                                       "versions": facts["versions"]}, {facts["script"]: "cuda_bugs.py"}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="NAME")
    parser.add_argument("--skip-sandbox", action="store_true")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--cuda", metavar="OUT", type=Path)
    parser.add_argument("--import-cuda", metavar="OUT", type=Path)
    args = parser.parse_args()
    if args.list:
        for case in CASES:
            print(f"{case.name:40} {case.category:10} {case.needs or '-':8} {case.about}")
        return
    if args.cuda:
        return cuda_cases(args.cuda)
    if args.import_cuda:
        return import_cuda(args.import_cuda)
    unknown = set(args.only) - {c.name for c in CASES}
    if unknown:
        raise SystemExit(f"no such case: {', '.join(sorted(unknown))}")
    for case in CASES:
        if (args.only and case.name not in args.only) or case.needs == "cuda" \
                or (case.needs == "sandbox" and args.skip_sandbox):
            continue
        print(f"making {case.name} ...", flush=True)
        entry = make(case)
        update(entry)
        print(f"  {entry['made']['how']}, exit {entry['made'].get('exit_code')}, "
              f"{sum(f['bytes'] for f in entry['files'])} bytes, {entry['made']['seconds']} s", flush=True)


if __name__ == "__main__":
    main()
