"""`orch mcp`: orch's core as typed tools for AI agents, over the Model Context Protocol.

    policy.py   which tools the server lists and for which targets (read-only by default)
    audit.py    every tool call, recorded in the run store (`orch runs audit`)
    tools.py    the tools themselves: plain functions over Fleet, payload_api, runner, store
    server.py   the MCP server (the `mcp` SDK, imported only by `orch mcp`)
    cli.py      the click commands
"""
