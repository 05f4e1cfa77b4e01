"""How often `orch explain` is right, measured on the labelled corpus of real failures
(tests/fixtures/explain_corpus, made by tests/corpus/make_explain_corpus.py).

For every case: its logs (and run record) are explained as `orch explain` explains them, the
frames read in a local target with the real torch 2.13 CPU venv (tests/support/torchenv.py), or in a
hard-link copy of it with orch's fx-threads patch applied for the cases explained after the
patch. Then, against the case's labels:

- lead cause: what the answer leads with is the case's cause (the exception's type and
  message, and the worker it names; a rank's death by a signal; a hang; nothing at all);
- false shared state: a case whose failure involves no shared state gets a shared-state
  remedy;
- race found: a race's leading candidate is the state the race is on, with a remedy.

The figure for orch before the corpus (its first failure listed taken as its lead) is this
script at commit f21f948, which read that orch's API.

    .venv/bin/python benchmarks/explain_corpus.py            # the table, per category
    .venv/bin/python benchmarks/explain_corpus.py -v         # and every case's answer
    .venv/bin/python benchmarks/explain_corpus.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.runs.model import RunRecord  # noqa: E402
from orchestrator.targets.fleet import Fleet  # noqa: E402
from orchestrator.forensics import explain as explaining  # noqa: E402
from tests.support.torchenv import torch_venv  # noqa: E402

CORPUS = REPO / "tests" / "fixtures" / "explain_corpus"
WORKLOADS = REPO / "tests" / "corpus" / "workloads"
CATEGORIES = ("single", "threads", "multi-rank", "race", "hang")


def load_cases(names: Optional[list[str]] = None) -> list[dict]:
    cases = json.loads((CORPUS / "manifest.json").read_text())["cases"]
    return [c for c in cases if not names or c["name"] in names]


# ------------------------------------------------------------------ the venvs frames are read in
@contextmanager
def venvs(patched: bool = True):
    """{"torch": the cached torch venv, "patched": a copy with orch's fx-threads patch}."""
    folder = Path(tempfile.mkdtemp(prefix="explain-corpus-"))
    found = {"torch": torch_venv()}
    try:
        if patched:
            copy = folder / "patched-venv"
            subprocess.run(["cp", "-al", found["torch"], str(copy)], check=True)
            with fleet_of({"dev": str(copy)}, folder) as fleet:
                from orchestrator.remote import payload_api
                payload_api.fx_patch(fleet.targets(["dev"])[0], "apply", "fx-threads")
            found["patched"] = str(copy)
        yield found
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def fleet_of(containers: dict[str, str], folder: Path):
    path = folder / f"inventory-{len(list(folder.glob('inventory-*')))}.yaml"
    lines = ["hosts:", "  here: {transport: local}", "containers:"]
    lines += [f"  {name}: {{host: here, venv: '{venv}'}}" for name, venv in containers.items()]
    path.write_text("\n".join(lines + [f"default_target: {next(iter(containers))}", ""]))
    with Fleet.from_path(str(path)) as fleet:
        yield fleet


def put_back_scripts(case: dict) -> None:
    """The workload scripts where the run had them, so that their frames have source."""
    for path, name in (case.get("scripts") or {}).items():
        source = WORKLOADS / name
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if not os.path.exists(path) or Path(path).read_bytes() != source.read_bytes():
                shutil.copy(source, path)
        except OSError:
            pass      # not writable here: those frames are shown without source


# ------------------------------------------------------------------ explaining a case
def case_logs(case: dict) -> dict[str, list]:
    """Each target's logs, as `orch explain` reads them in the target (by their paths there)."""
    by_target: dict[str, list] = {}
    for entry in case["files"]:
        if not entry.get("original"):
            continue
        text = (CORPUS / case["name"] / entry["path"]).read_bytes().decode("utf-8", "replace")
        by_target.setdefault(entry["target"], []).append((entry["original"], text))
    record = case_record(case)
    return {target: explaining.logs_from_files(target, files, explaining.rank_offset(record, target)
                                               if record is not None else 0)
            for target, files in by_target.items()}


def case_record(case: dict) -> Optional[RunRecord]:
    path = CORPUS / case["name"] / "record.json"
    return RunRecord.from_dict(json.loads(path.read_text())) if path.exists() else None


def explain_case(case: dict, found_venvs: dict, folder: Path) -> list:
    """The case's explanations, one per target (as `orch explain` gives them)."""
    put_back_scripts(case)
    logs, record = case_logs(case), case_record(case)
    venv = found_venvs[case["target"]]
    with fleet_of({name: venv for name in logs}, folder) as fleet:
        targets = {name: fleet.targets([name])[0] for name in logs}
        if record is not None:
            return explaining.explain_logs(record, [(targets[n], logs[n]) for n in logs])
        [(name, texts)] = logs.items()
        return [explaining.explain(targets[name], texts)]


# ------------------------------------------------------------------ scoring
def answer_of(explanations: list) -> dict:
    """What the explanation leads with, and the shared state it claims."""
    lead = explanations[0].lead if explanations else None     # the run's cause leads
    candidates = [c for e in explanations for c in e.candidates]
    return {"lead": lead.to_dict() if lead is not None else None,
            "remedies": [r.state for e in explanations for r in e.remedies],
            "top_state": candidates[0].ref if candidates else "",
            "top_confidence": candidates[0].confidence if candidates else ""}


def lead_right(expected: dict, lead: Optional[dict]) -> bool:
    if expected.get("none"):
        return lead is None
    if lead is None:
        return False
    if expected.get("hang"):
        return lead["kind"] == "hang"
    if expected.get("signal"):
        return lead["kind"] == "signal" and lead.get("signal") == expected["signal"] \
            and expected.get("worker") in lead.get("workers", [])
    return (lead["kind"] in ("exception", "waited") and lead.get("exception") == expected["exception"]
            and expected["message"] in (lead.get("message") or "")
            and (not expected.get("worker") or expected["worker"] in lead.get("workers", [])))


def score(case: dict, answer: dict) -> dict:
    return {"name": case["name"], "category": case["category"],
            "lead_right": lead_right(case["lead"], answer["lead"]),
            "false_shared_state": not case["shared_state"] and bool(answer["remedies"]),
            "race_found": case["shared_state"] and answer["top_state"] == case["state"]
            and bool(answer["remedies"]),
            "answer": answer}


def table(rows: list[dict]) -> list[str]:
    out = ["| category | cases | lead cause right | false shared-state remedies | races: state found |",
           "| --- | ---: | ---: | ---: | ---: |"]
    for category in (*CATEGORIES, "all"):
        chosen = [r for r in rows if category in ("all", r["category"])]
        if not chosen:
            continue
        right = sum(r["lead_right"] for r in chosen)
        plain = [r for r in chosen if not r["shared"]]
        false = sum(r["false_shared_state"] for r in plain)
        races = [r for r in chosen if r["shared"]]
        found = sum(r["race_found"] for r in races)
        out.append(f"| {category} | {len(chosen)} | {right}/{len(chosen)} ({100 * right / len(chosen):.0f} %) | "
                   f"{false}/{len(plain)} | " + (f"{found}/{len(races)}" if races else "-") + " |")
    return out


def run(names: Optional[list[str]] = None) -> list[dict]:
    cases = load_cases(names)
    folder = Path(tempfile.mkdtemp(prefix="explain-corpus-run-"))
    rows = []
    try:
        with venvs(patched=any(c["target"] == "patched" for c in cases)) as found:
            for case in cases:
                started = time.perf_counter()
                row = score(case, answer_of(explain_case(case, found, folder)))
                row.update(seconds=round(time.perf_counter() - started, 2), shared=case["shared_state"],
                           expected=case["lead"])
                rows.append(row)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="CASE")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = run(args.only or None)
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    if args.verbose:
        for row in rows:
            mark = "ok  " if row["lead_right"] else "MISS"
            lead = row["answer"]["lead"] or {}
            said = (f"{lead.get('kind')}: {lead.get('exception') or lead.get('signal') or ''} "
                    f"{(lead.get('message') or '')[:70]!r} {lead.get('workers')}") if lead else "nothing"
            print(f"{mark} {row['name']:38} {said}"
                  + (f"  [remedy for {', '.join(row['answer']['remedies'])}]" if row["answer"]["remedies"] else "")
                  + ("  FALSE SHARED STATE" if row["false_shared_state"] else ""))
            if not row["lead_right"]:
                print(f"     expected {row['expected']}")
        print()
    print("\n".join(table(rows)))
    print(f"\n{len(rows)} cases in {time.perf_counter() - started:.1f} s "
          f"(explain per case: median {sorted(r['seconds'] for r in rows)[len(rows) // 2]:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
