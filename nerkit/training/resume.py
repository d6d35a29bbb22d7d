"""Whether a resumed run is the run it continues: two configs compared on what trains the model and
what it is trained on, leaving out what a resume may change (the `resumable` keys of nerkit.config).
Used by `nerkit train --resume` (run_dir) and `nerkit bench`, which continues a matrix's runs."""

from __future__ import annotations

from pathlib import Path

from nerkit.config import RESUMABLE_KEYS, Config, config_to_dict


def run_differences(a: Config, b: Config, distilled: bool = True) -> list[str]:
    """How two configs differ in what trains the model and what it is trained on, one
    `section.key: A -> B` each (nested keys flattened with dots); what a resumed run may change
    (RESUMABLE_KEYS) and the output directory do not count, nor, for a run that is not distilled
    (`nerkit train`), the `distill` section, which only `nerkit distill` reads."""
    fa, fb = _fixed(a), _fixed(b)
    if not distilled:
        fa, fb = ({k: v for k, v in f.items() if not k.startswith("distill.")} for f in (fa, fb))
    return [f"{key}: {fa.get(key)!r} -> {fb.get(key)!r}" for key in sorted(fa.keys() | fb.keys())
            if fa.get(key) != fb.get(key)]


def same_run(a: Config, b: Config) -> bool:
    """Whether two configs train the same model on the same data, differing at most in what a
    resumed run may change (RESUMABLE_KEYS) and in the output directory."""
    return not run_differences(a, b)


def _fixed(config: Config) -> dict:
    """The config's keys that a resume must keep, flattened, with files named as one file."""
    resolved = config_to_dict(config)
    resolved.pop("output_dir")
    for key in RESUMABLE_KEYS:
        section, name = key.split(".")
        resolved[section].pop(name)
    for kind in ("char", "bichar", "word"):  # a width the vector file gives: null before training, the file's after
        if resolved["embeddings"].get(f"{kind}_vectors"):
            resolved["embeddings"].pop(f"{kind}_dim")
    for split in ("train", "dev", "test"):  # one file named two ways (NERKIT_DATA relative or absolute) is one file
        path = resolved["data"][split]
        if path and Path(path).is_file():
            resolved["data"][split] = str(Path(path).resolve())
    return flatten(resolved)


def flatten(tree: dict, prefix: str = "") -> dict:
    """A config tree as dotted keys (a list, e.g. stacked language models, stays one value)."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
