"""`python -m nerkit` runs the command-line interface."""

from nerkit.cli.app import main

main()
