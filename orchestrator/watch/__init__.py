"""Watching a run: its output read as data, its workers' states, its verdict.

logformats (metric lines recognised by shape), distributed and torchrun (ranks, their
failure texts), classify (from what was seen to a verdict) and monitor (following a log and
the process behind it until it ends).
"""
