"""LAC-small as a directory: `nerkit vectors export-lac` writes config.json, word.dic, tag.dic and
model.safetensors; reading it back checks every file and names the fix."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from safetensors.torch import save as safetensors_bytes
from torch import nn

from nerkit.errors import UserError
from nerkit.files import (
    WRITE_ERRNOS,
    atomic_directory,
    atomic_write_bytes,
    atomic_write_text,
    check_output_directory,
)
from nerkit.pretrained.base import (
    MIX_FILE,
    OPTIONS_FILE,
    _read_optional_json,
)
from nerkit.pretrained.lac import (
    CHARS_FILE,
    EXPORT_FIX,
    MODEL_TYPE,
    TAGS_FILE,
    WEIGHTS_FILE,
    LACConfig,
    LACEmbedder,
    LACEncoder,
    LACTagger,
    LACVocab,
)
from nerkit.pretrained.paddle import _read_tags, read_jieba_lac
from nerkit.weights import load_checked, read_safetensors

# ------------------------------------------------------------------------------------ directories

def export_lac(out_dir: str | Path, fold: bool = True, force: bool = False) -> dict:
    """Write jieba's LAC-small as a nerkit directory (`write_directory`): into a new or empty
    directory, or, with `force`, over an earlier LAC directory."""
    check_output_directory(out_dir, force, own=is_lac_directory, what="an earlier LAC export")
    tagger, vocab, tags = read_jieba_lac(fold)
    return write_directory(out_dir, tagger, vocab, tags, source="jieba's lac_small (Baidu LAC, Apache-2.0)")


def write_directory(out_dir: str | Path, tagger: LACTagger, vocab: LACVocab, tags: list[str], source: str) -> dict:
    """config.json (model_type lac-bigru, the sizes, `source`), word.dic, tag.dic and
    model.safetensors (encoder, emission layer and CRF), written atomically."""
    out_dir = Path(out_dir)
    meta = {**tagger.encoder.config.to_dict(), "source": source}
    state = {k: v.detach().cpu().contiguous() for k, v in tagger.state_dict().items()}
    try:
        with atomic_directory(out_dir) as tmp:
            atomic_write_text(tmp / "config.json", json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
            atomic_write_text(tmp / CHARS_FILE, vocab.lines())
            atomic_write_text(tmp / TAGS_FILE, "".join(f"{i}\t{t}\n" for i, t in enumerate(tags)))
            atomic_write_bytes(tmp / WEIGHTS_FILE, safetensors_bytes(state, metadata={"format": "pt"}))
    except OSError as e:
        if e.errno in WRITE_ERRNOS:
            raise UserError(f"cannot write the LAC directory ({e.strerror})", where=str(out_dir),
                            fix="free disk space or choose another --out") from None
        raise
    return {"path": str(out_dir), "characters": len(vocab), "tags": len(tags),
            "parameters": sum(v.numel() for v in state.values()),
            "embedding": list(state["encoder.embedding.weight"].shape)}


def is_lac_directory(directory: Path) -> bool:
    return _read_optional_json(directory / "config.json").get("model_type") == MODEL_TYPE


def read_config(directory: Path) -> LACConfig:
    """config.json of a LAC directory: its model_type, every size and `fold`, checked."""
    path = directory / "config.json"
    if not path.is_file():
        raise UserError("config.json not found", where=str(directory), fix=EXPORT_FIX)
    data = _read_optional_json(path)
    if data.get("model_type") != MODEL_TYPE:
        raise UserError(f"not a LAC directory (model_type {data.get('model_type')!r}, not {MODEL_TYPE!r})",
                        where=str(path), fix=EXPORT_FIX)
    missing = [k for k in asdict(LACConfig()) if k not in data]
    if missing:
        raise UserError(f"config.json lacks {', '.join(missing)}", where=str(path), fix=EXPORT_FIX)
    config = LACConfig(**{k: data[k] for k in asdict(LACConfig())})
    sizes = [v for k, v in asdict(config).items() if k != "fold"]
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in sizes):
        raise UserError("the sizes must be positive integers", where=str(path), fix=EXPORT_FIX)
    if not isinstance(config.fold, bool):
        raise UserError("fold must be true or false", where=str(path), fix=EXPORT_FIX)
    return config


def load_tagger(directory: str | Path) -> tuple[LACTagger, LACVocab, list[str]]:
    """The whole LAC tagger of an exported directory (`export_lac`)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError("LAC directory not found", where=str(directory), fix=EXPORT_FIX)
    config = read_config(directory)
    tagger = LACTagger(config)
    _load_weights(tagger, directory / WEIGHTS_FILE)
    return tagger.eval(), _vocab(directory, config), _read_tags(directory / TAGS_FILE)


def load_lac(directory: str | Path, layers: str = "last", finetune: bool = False, bf16: bool = False,
             weights: bool = True) -> LACEmbedder:
    """The `LACEmbedder` of an exported directory, or of a model directory's lm/ (there without
    `weights`: the tagger's model.safetensors fills them)."""
    directory = Path(directory)
    config = read_config(directory)
    encoder = LACEncoder(config)
    if weights:
        _load_weights(encoder, directory / WEIGHTS_FILE, prefix="encoder.")
    return LACEmbedder(encoder, _vocab(directory, config), layers=layers, finetune=finetune, bf16=bf16)


def _vocab(directory: Path, config: LACConfig) -> LACVocab:
    vocab = LACVocab.read(directory / CHARS_FILE, config.fold)
    if max(vocab.entries.values()) >= config.vocab_size:
        raise UserError(f"ids reach {max(vocab.entries.values())} but config.json's vocab_size is "
                        f"{config.vocab_size}", where=str(directory / CHARS_FILE), fix=EXPORT_FIX)
    return vocab


def _load_weights(module: nn.Module, path: Path, prefix: str = "") -> None:
    """Fill `module` from the safetensors file, whose names carry `prefix` (other names are left)."""
    state = read_safetensors(path, fix=EXPORT_FIX)
    load_checked(module, {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)},
                 "the weights do not fit config.json", where=str(path), fix=EXPORT_FIX, extra_ok=True)


def save_lac(embedder: LACEmbedder, target: str | Path, weights: bool = True) -> Path:
    """`nerkit.pretrained.loading.save_lm` for LAC: the directory `target` (a model directory's lm/,
    or one of a stack's lm/0/, lm/1/, ...) with config.json, word.dic, the embedder's options and,
    with `weights`, the encoder's (possibly fine-tuned) weights and scalar mix."""
    target = Path(target)
    options = {"layers": embedder.layers, "finetune": embedder.finetune, "bf16": embedder.bf16}
    with atomic_directory(target) as tmp:
        atomic_write_text(tmp / "config.json", json.dumps(embedder.lm.config.to_dict(), indent=2) + "\n")
        atomic_write_text(tmp / CHARS_FILE, embedder.vocab.lines())
        atomic_write_text(tmp / OPTIONS_FILE, json.dumps(options, indent=2) + "\n")
        if weights:
            state = {"encoder." + k: v.detach().cpu().contiguous() for k, v in embedder.lm.state_dict().items()}
            atomic_write_bytes(tmp / WEIGHTS_FILE, safetensors_bytes(state, metadata={"format": "pt"}))
            if embedder.scalar_mix is not None:
                mix = {k: v.detach().cpu().contiguous() for k, v in embedder.scalar_mix.state_dict().items()}
                atomic_write_bytes(tmp / MIX_FILE, safetensors_bytes(mix))
    return target
