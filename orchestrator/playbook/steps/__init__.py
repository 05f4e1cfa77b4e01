"""Step kinds: one small module each. STEP_KINDS maps a playbook key to its class."""

from __future__ import annotations

from orchestrator.playbook.steps.bootstrap import BootstrapStep
from orchestrator.playbook.steps.collect import CollectStep
from orchestrator.playbook.steps.ensure import EnsureStep
from orchestrator.playbook.steps.grep import GrepStep
from orchestrator.playbook.steps.launch import LaunchStep
from orchestrator.playbook.steps.monitor import MonitorStep
from orchestrator.playbook.steps.patch import PatchStep
from orchestrator.playbook.steps.push import PushStep
from orchestrator.playbook.steps.shell import ShellStep
from orchestrator.playbook.steps.verify import VerifyStep

STEP_KINDS = {cls.kind: cls for cls in (EnsureStep, BootstrapStep, GrepStep, PatchStep, VerifyStep,
                                        PushStep, LaunchStep, MonitorStep, CollectStep, ShellStep)}
