"""What a monitor or a follower handed on, kept for a test to read."""

from __future__ import annotations

from orchestrator.watch.monitor import MonitorSink


class Sink(MonitorSink):
    def __init__(self):
        self.lines, self.points, self.notes = [], [], []

    def log_line(self, target, line):
        self.lines.append(line)

    def note(self, target, text, level="info"):
        self.notes.append(text)

    def metrics(self, target, points):
        self.points.extend(points)
