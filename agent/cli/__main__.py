"""`python -m agent.cli`: the same as the `tierpilot` command."""
from agent.cli import main

main()
