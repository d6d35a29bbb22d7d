"""The version of nerkit, in one place: `nerkit --version`, model directories and benchmark records
name it; pyproject.toml reads it from here."""

__version__ = "0.1.0"
