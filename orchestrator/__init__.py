"""orch: remote debugging orchestrator for Proxmox GPU containers."""

__version__ = "0.1.0"
