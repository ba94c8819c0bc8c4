"""`python -m orbit` is the `orbit` command."""

from orbit.cli.app import main

main()
