"""`python -m nerkit` runs the command-line interface."""

from nerkit.cli import main

main()
