"""The CLI's screens: a playbook run's live view and summary (run, its step log) and the
fan-out progress of a command on many targets. Only the commands draw them."""
