"""The `nerkit` command line (entry point `nerkit.cli:main`): `app` holds the app and the commands
of training and using a model; `plot` and `vectors` their command groups; `serve` the web service;
`export` the ONNX export. A command parses, calls one function, prints."""

from nerkit.cli.app import process_main as main  # `main` ending the process without Python's teardown

__all__ = ["main"]
