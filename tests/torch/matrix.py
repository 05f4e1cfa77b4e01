"""scripts/torch-matrix.py loaded as a module (its name has a dash), for the tests that
use its cache of release sources and its checks."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "torch-matrix.py"
_spec = importlib.util.spec_from_file_location("torch_matrix", _SCRIPT)
matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(matrix)
