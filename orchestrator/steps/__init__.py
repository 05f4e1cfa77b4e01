"""Step kinds: one small module each. STEP_KINDS maps a playbook key to its class."""

from __future__ import annotations

from orchestrator.steps.bootstrap import BootstrapStep
from orchestrator.steps.collect import CollectStep
from orchestrator.steps.ensure import EnsureStep
from orchestrator.steps.grep import GrepStep
from orchestrator.steps.launch import LaunchStep
from orchestrator.steps.monitor import MonitorStep
from orchestrator.steps.patch import PatchStep
from orchestrator.steps.push import PushStep
from orchestrator.steps.shell import ShellStep
from orchestrator.steps.verify import VerifyStep

STEP_KINDS = {cls.kind: cls for cls in (EnsureStep, BootstrapStep, GrepStep, PatchStep, VerifyStep,
                                        PushStep, LaunchStep, MonitorStep, CollectStep, ShellStep)}
