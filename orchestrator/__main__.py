from orchestrator.cli.main import main

main()  # `python -m orchestrator` is `orch`: the quick commands go to the agent (docs/guide/agent.md)
