"""The warm agent process (docs/guide/agent.md): a per-user daemon that runs orch's quick commands
with its SSH connections already open. It runs the CLI's own click commands, so it sits above
the CLI; its clients reach it through orchestrator/agent/.

server.py    its socket, the peer check, its life (idle exit, stop, code changed on disk)
requests.py  one request: the same click command in a thread, under the request's own
             invocation (stdio, environment, folder, terminal size, interrupt token)
pool.py      warm fleets lent to commands, reopened when what they rest on changes
"""
