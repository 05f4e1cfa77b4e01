"""Targets: what orch drives and how it finds it.

fleet (the inventory's hosts and containers, opened on demand, fan-out), proxmox (the Proxmox
API over pvesh or HTTPS), distro (what a container's OS needs to bootstrap a venv) and
inventory_check (`orch inventory check`).
"""
