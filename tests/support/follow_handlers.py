"""A follower's handler that keeps what it was given."""

from __future__ import annotations

from orchestrator.watch.monitor import FollowHandler


class Collect(FollowHandler):
    def __init__(self):
        self.data = b""
        self.connections = []

    def on_data(self, data):
        self.data += data

    def on_connection(self, up, detail, downtime=0.0):
        self.connections.append((up, detail))
