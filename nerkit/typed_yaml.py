"""Typed YAML: dataclasses filled from mappings, each value coerced to its field's type and checked
against what the field declares (a `Literal` of choices, a range and a duration in its metadata), with
`${VAR}` interpolation, dotted `section.key=value` overrides and errors that name the key and suggest a
fix. The config (nerkit.config) and the benchmark matrix (nerkit.tools.bench.matrix) both read through
it; it imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Callable, Literal

import yaml

from nerkit.errors import ConfigError, did_you_mean

# What to do about a YAML syntax error, at the line the message names.
YAML_FIX = ("correct the YAML at that line: spaces, not tabs, for indentation; a ': ' after each key; "
            "quotes around a value holding ': ' or ' #'")


def read_yaml(path: str | Path, what: str, fix: str | None = None) -> Any:
    """A YAML file's contents; a missing file, bad YAML (with its line) or non-UTF-8 text is a ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} not found", where=str(path), fix=fix)
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"not valid YAML ({getattr(e, 'problem', e)})", where=where, fix=YAML_FIX) from None
    except UnicodeDecodeError:
        raise ConfigError(f"the {what} is not UTF-8 text", where=str(path), fix="save it as UTF-8") from None


# ----------------------------------------------------------------------------- declaring fields
# A number's allowed values are an interval, written as in mathematics ("[0, 1)": 0 allowed, 1 not);
# a number field that declares none may be any finite value from 0 up.
ANY_AMOUNT = "[0, inf)"
_INTERVAL = re.compile(r"^(?P<open>[\[(])(?P<low>[^,]+),\s*(?P<high>[^\])]+)(?P<close>[\])])$")


def ranged(default: Any, within: str, *, duration: bool = False, **metadata) -> Any:
    """A field whose numbers must lie `within` an interval ("[1, inf)", "[0, 1)", "(0, 1]"); a
    `duration` is also read from "90s", "20m", "1.5h". `metadata` is the field's own, kept beside."""
    _interval(within)  # a malformed interval fails at import, not when a config loads
    return dataclasses.field(default=default, metadata={"range": within, "duration": duration, **metadata})


def interval(f: dataclasses.Field) -> str:
    """The interval a number field's values must lie in (ANY_AMOUNT unless it declares one)."""
    return f.metadata.get("range", ANY_AMOUNT)


def is_duration(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("duration"))


@functools.lru_cache(maxsize=None)
def _interval(text: str) -> tuple[float, float, bool, bool]:
    m = _INTERVAL.match(text)
    if not m:
        raise ValueError(f"not an interval: {text!r} (write e.g. '[0, 1)')")
    return float(m["low"]), float(m["high"]), m["open"] == "(", m["close"] == ")"


def _out_of(value: float, text: str) -> str | None:
    """Why `value` lies outside interval `text`, in words, or None when it lies inside."""
    low, high, low_open, high_open = _interval(text)
    inside = (low < value if low_open else low <= value) and (value < high if high_open else value <= high)
    if inside:
        return None
    if not math.isfinite(value):
        return "must be a finite number"
    words = range_words(text)
    return "must not be negative" if words == "not negative" else f"must be {words}"


def range_words(text: str) -> str:
    """Interval `text` in words: "at least 1", "positive", "not negative", or "in [0, 1)"."""
    low, high, low_open, high_open = _interval(text)
    if math.isinf(high) and high_open:
        if low == 0:
            return "positive" if low_open else "not negative"
        if not low_open:
            return f"at least {low:g}"
    return f"in {text}"


@functools.lru_cache(maxsize=None)
def hints(cls) -> dict[str, Any]:
    """Field name -> its type, resolved (the modules write `from __future__ import annotations`)."""
    return typing.get_type_hints(cls)


def choices(cls, name: str) -> tuple | None:
    """The values field `name` of dataclass `cls` allows, when its type is a Literal (else None)."""
    hint = hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)] if _is_union(hint) else [hint]
    if len(args) == 1 and typing.get_origin(args[0]) is Literal:
        return typing.get_args(args[0])
    return None


def _is_union(hint) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


# ----------------------------------------------------------------------------- reading values
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
DEFAULT_VARS = {"NERKIT_DATA": "data"}


def interpolate(value: str, where: str) -> str:
    """`${VAR}` and `${VAR:-default}` replaced from the environment (NERKIT_DATA defaults to `data`)."""
    def sub(m):
        name, default = m.group(1), m.group(2)
        value = os.environ.get(name)
        if value is not None and (value or default is None):
            return value
        if default is not None:  # as in the shell, `${VAR:-default}` also replaces an empty VAR
            return default
        if name in DEFAULT_VARS:
            return DEFAULT_VARS[name]
        raise ConfigError(f"environment variable {name} is not set", where=where,
                          fix=f"export {name}=... or write ${{{name}:-default}}")
    return _VAR.sub(sub, value)


def coerce(value: Any, annotation, where: str) -> Any:
    """Coerce a YAML value to a field's type: PyYAML reads `1e-3` as a string, users write `"32"`.
    A Literal's values are strings."""
    if _is_union(annotation):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none", "~")):
            return None
        return coerce(value, args[0], where)
    if annotation is Any:
        return value
    if typing.get_origin(annotation) is Literal:
        annotation = str
    if isinstance(value, str):
        value = interpolate(value, where)
    try:
        if annotation is bool:
            return _bool(value)
        if annotation is int:
            return _int(value)
        if annotation is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if annotation is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{value!r} is not a valid {annotation.__name__}", where=where) from None
    return value


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.lower() in ("true", "yes", "on", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError


def _int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, (float, str)):
        f = float(value)
        if not f.is_integer():
            raise ValueError
        return int(f)
    return int(value)


_DURATION = re.compile(r"^\s*(?P<number>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*(?P<unit>[smh]?)\s*$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600}


def _duration(value: Any, where: str) -> Any:
    """A duration in seconds from "90s", "20m", "1.5h" or a plain number; anything else is left to
    `coerce` (which names the key when it is not a number)."""
    if not isinstance(value, str):
        return value
    m = _DURATION.match(interpolate(value, where))
    if not m:
        raise ConfigError(f"{value!r} is not a duration", where=where,
                          fix='write seconds, or a number with s, m or h: "90s", "20m", "1.5h"')
    return float(m["number"]) * _SECONDS[m["unit"]]


def parse_duration(text: str, where: str) -> float:
    """Seconds from "90s", "20m", "1.5h" or a plain number (a command-line option's duration)."""
    seconds = float(_duration(text, where))
    if seconds < 0:
        raise ConfigError(f"{text!r} must not be negative", where=where)
    return seconds


def suggest(key: str, valid) -> str:
    return did_you_mean(key, valid) or f"valid keys: {', '.join(sorted(valid))}"


# ----------------------------------------------------------------------------- filling dataclasses
def fill(cls, values: dict | None, label: str, origin: Callable[[str], str], retired: frozenset = frozenset()):
    """Dataclass `cls` built from mapping `values`, every key checked against its field: its type,
    its choices (a Literal), its range (ANY_AMOUNT unless the field declares one). A field whose type
    is a dataclass `D`, or `D | list[D]`, is filled from a mapping or a list of them. Every error names
    `label.key` and `origin(label.key)`, where its value was given; keys in `retired` are dropped."""
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"section {label!r} must be a mapping of keys to values", where=origin(label))
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        dotted = f"{label}.{key}"
        if key not in known:
            if key in retired:
                continue
            raise ConfigError(f"unknown key {dotted}", where=origin(dotted), fix=suggest(key, known))
        kwargs[key] = _value(cls, known[key], value, dotted, origin)
    return cls(**kwargs)


def _value(cls, f: dataclasses.Field, value: Any, dotted: str, origin: Callable[[str], str]) -> Any:
    hint = hints(cls)[f.name]
    inner = [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)] if _is_union(hint) else [hint]
    if inner and dataclasses.is_dataclass(inner[0]):  # a section inside a section, e.g. embeddings.lm
        if isinstance(value, list) and _is_union(hint):
            return _items(inner[0], value, dotted, origin)
        return fill(inner[0], value, dotted, origin)
    where = origin(dotted)
    if is_duration(f):
        value = _duration(value, f"{where}: {dotted}")
    return value_of(value, hint, dotted, where, interval(f), choices(cls, f.name))


def value_of(value: Any, annotation, label: str, where: str, within: str = ANY_AMOUNT, allowed: tuple | None = None):
    """`value` coerced to `annotation` and checked: one of `allowed` (when given), a number `within`
    its interval. Errors name `label` and `where` the value was given."""
    value = coerce(value, annotation, f"{where}: {label}")
    if allowed and value is not None and value not in allowed:
        raise ConfigError(f"{label} = {value!r} is not one of {', '.join(allowed)}", where=where,
                          fix=did_you_mean(value, allowed))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        why = _out_of(value, within)
        if why:
            raise ConfigError(f"{label} = {value} {why}", where=where)
    return value


def _items(cls, values: list, dotted: str, origin: Callable[[str], str]) -> list:
    """A list of mappings, each filled as `cls` and named `dotted[k]`."""
    if not values:
        raise ConfigError(f"{dotted} is an empty list", where=origin(dotted),
                          fix=f"list at least one item (a mapping), or leave {dotted} out")
    items = []
    for k, value in enumerate(values):
        label = item_label(dotted, k)
        if not isinstance(value, dict):
            raise ConfigError(f"{label} is {type(value).__name__} {value!r}, not a mapping", where=origin(label),
                              fix="write each item as a mapping, e.g. - {path: lm/m3e-small, finetune: true}")
        items.append(fill(cls, value, label, origin))
    return items


def item_label(section: str, k: int) -> str:
    """How messages name item k of a section given as a list (stacked sources): `embeddings.lm[1]`."""
    return f"{section}[{k}]"


# ----------------------------------------------------------------------------- overrides
def parse_override(text: str) -> tuple[list[str], Any]:
    """`section.key=value` as (["section", "key"], value), the value read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} has no '='", fix="write --set section.key=value, e.g. --set train.lr=0.01")
    key, raw = text.split("=", 1)
    path = key.strip().split(".")
    if not all(path):
        raise ConfigError(f"override key {key!r} is malformed", fix="write --set section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return path, value


def set_path(section, path: list[str], value):
    """A copy of `section` (a mapping, or nothing yet) with `value` at `path`."""
    section = dict(section) if isinstance(section, dict) else {}
    section[path[0]] = value if len(path) == 1 else set_path(section.get(path[0]), path[1:], value)
    return section


def override_origin(set_by: dict[str, str], source: str) -> Callable[[str], str]:
    """`origin` for `fill`: where key `dotted` (`train.lr`, `embeddings.lm[1].path`) was given, the
    `--set` that gave it or a section above it (`set_by`: dotted key -> override), else `source`."""
    def origin(dotted: str) -> str:
        parts = re.sub(r"\[\d+\]", "", dotted).split(".")
        for n in range(len(parts), 0, -1):
            text = set_by.get(".".join(parts[:n]))
            if text is not None:
                return f"--set {text}"
        return source
    return origin
