"""The warm agent: a per-user background process that runs orch's quick commands with its
SSH connections already open (docs/agent.md).

protocol.py  where the socket lives, the messages and their framing (stdlib only)
client.py    the `orch` entry point: hands a quick command to the agent, else runs it here
server.py    the agent itself: runs the same click commands in threads, one per request
cli.py       `orch agent start|stop|status`
"""
