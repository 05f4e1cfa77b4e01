"""What several test folders share: fakes of a host for the step kinds, the builders of the
cached torch and pystack venvs, the warm agent's helpers."""
