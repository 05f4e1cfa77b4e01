"""orch's record of a patch: <record dir>/record.json and backups/<path>.orig.

The record directory (default <site-packages>/.orch-fx-tls/) sits beside torch/, not in
it, so searches of torch/ do not show the backups and the record survives a reinstall of
torch, which is how "drifted" is seen. One record per torch: every patch set writes here.
Schema 1 (orch's first fx-tls) has no "patch_set" or "states": it patched the flag alone.
Inlined when shipped, like _protocol.py; standard library only.
"""

import datetime
import json
import os

from _protocol import *  # orch: inlined when shipped
from _fx_files import *  # orch: inlined when shipped

RECORD_DIR_NAME = ".orch-fx-tls"
RECORD_FILE = "record.json"
RECORD_SCHEMA = 2


def record_path(record_dir):
    return os.path.join(record_dir, RECORD_FILE)


def backup_relpath(relpath):
    # ".orig", not ".py": no tool should take a backup for importable source.
    return "backups/" + relpath + ".orig"


def backup_path(record_dir, relpath):
    return os.path.join(record_dir, *backup_relpath(relpath).split("/"))


def load_record(record_dir):
    data = read_bytes(record_path(record_dir))
    if data is None:
        return None
    try:
        record = json.loads(data.decode("utf-8"))
        if all(isinstance(f["path"], str) and "sha256_before" in f and "sha256_after" in f
               for f in record["files"]) and isinstance(recorded_states(record), list):
            return record
    except (ValueError, KeyError, TypeError):
        pass
    raise PayloadError("the record %s is not readable; move it away and check the torch "
                       "files by hand (status shows them)" % record_path(record_dir),
                       "bad-record")


def recorded_states(record):
    """The shared states a record made thread-local (schema 1: the flag)."""
    return record.get("states", ["fx-tracing-flag"])


def recorded_patch_set(record):
    return record.get("patch_set", "fx-tls")


def save_record(record_dir, record):
    write_atomic(record_path(record_dir), (json.dumps(record, indent=2) + "\n").encode())


def record_summary(record):
    summary = dict((key, record.get(key)) for key in
                   ("state", "applied_at", "orch_version", "torch_version", "python"))
    summary.update(patch_set=recorded_patch_set(record), states=recorded_states(record))
    return summary


def orphan_backups(record_dir):
    """Backups with no record beside them (an apply killed before it recorded anything):
    reported, never deleted by orch."""
    if os.path.exists(record_path(record_dir)):
        return []
    top = os.path.join(record_dir, "backups")
    found = []
    for directory, _, names in os.walk(top):
        for name in names:
            if TEMP_NAME.match(name):
                continue  # a killed write's temp file: leftover_temp_files lists it
            found.append(os.path.relpath(os.path.join(directory, name), record_dir)
                         .replace(os.sep, "/"))
    return sorted(found)


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
