"""Playbooks: YAML files of steps, templated with jinja2, checked with file:line:col errors.

loader (the YAML to steps), render (templates), steps/ (one module per step kind), engine
(runs the steps) and attach (follows a launched run again). Kept import-free, so that a step
module can be imported without the loader.
"""
