"""`python -m nerkit` runs the command-line interface."""

from nerkit.cli.app import process_main

process_main()
