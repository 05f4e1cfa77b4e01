"""The warm agent's client side (docs/guide/agent.md): what the `orch` entry point (orchestrator/cli/main.py)
and `orch agent` (cli/commands/agent.py) need to reach the agent. Stdlib only, no click, no paramiko.

protocol.py  where the socket lives, the messages and their framing
client.py    which commands the agent takes; handing one over (argv, environment, the caller's
             fds); starting the agent on first use

The agent process itself is orchestrator/agentd/: it runs the CLI's commands, so it sits
above the CLI, while this package sits below it.
"""
