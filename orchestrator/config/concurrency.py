"""How many targets a fan-out works on at once (exec, inventory check, grep-torch, patch over
a group), unless `--jobs` or the inventory's `defaults: {jobs: N}` says otherwise. Each is a
thread here and a channel on its host; a host's own limits (max_sessions x connections)
still hold, so a larger value only queues there (docs/guide/fleet.md). A module of its own,
without YAML: the commands' --help names the default."""

DEFAULT_JOBS = 32
MAX_JOBS = 1000
