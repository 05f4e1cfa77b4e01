"""The ground layer: what every other layer stands on and that imports nothing of orch's.

errors (OrchError, the exit codes), paths (where orch keeps its files), fx_states (the FX
state names the patch and its checks share), lazy (imports deferred to first call) and
console (printing for people and for scripts).
"""
