"""The `nerkit` command line (entry point `nerkit.cli:main`): `app` holds the app and the commands
of training and using a model; `plot` and `vectors` their command groups; `serve` the web service;
`export` the ONNX export. A command parses, calls one function, prints."""

from nerkit.cli.app import main

__all__ = ["main"]
