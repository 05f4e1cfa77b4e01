"""The warm agent: a per-user background process that runs orch's quick commands with its
SSH connections already open (docs/agent.md).

protocol.py  where the socket lives, the messages and their framing (stdlib only)
client.py    the `orch` entry point: hands a quick command to the agent, else runs it here
server.py    the agent itself: its socket, peer check, life (idle exit, stop, stale code)
requests.py  one request: the same click command in a thread, with per-request stdio,
             environment, consoles and signal handlers
pool.py      warm fleets lent to commands, reopened when what they rest on changes
cli.py       `orch agent start|stop|status`
"""
