"""The one table of language-model kinds: `load_lm` reads a local directory (a Hugging Face encoder,
or an exported LAC-small, told apart by config.json's model_type), and a model directory's `lm/` is
saved and loaded by the same table."""

from __future__ import annotations

import json
import re
from pathlib import Path

from safetensors.torch import save as safetensors_bytes

from nerkit.errors import ModelDirError, UserError
from nerkit.files import (
    atomic_directory,
    atomic_write_bytes,
    atomic_write_text,
)
from nerkit.pretrained.base import (
    MIX_FILE,
    OPTIONS_FILE,
    CharFeatures,
    _read_optional_json,
)
from nerkit.pretrained.bert import (
    FETCH_FIX,
    LMEmbedder,
    LMVocab,
    _build_lm,
    _read_config,
    _read_weights,
    character_level,
    check_vocab_size,
)
from nerkit.pretrained.hub_cache import lm_directory
from nerkit.pretrained.licences import LAC_LICENCE, read_terms, write_terms
from nerkit.pretrained.stacked import Stacked
from nerkit.pretrained.subword import SENTENCEPIECE_FILES, SubwordEmbedder, read_tokenizer
from nerkit.pretrained.vocab import LM_DIR
from nerkit.weights import load_checked, read_safetensors

# ------------------------------------------------------------------------------------ loading

# What a Hugging Face directory's tokenizer can be read from: a BERT vocabulary, a fast tokenizer's
# serialisation, or a SentencePiece model.
VOCABULARY_FILES = ("vocab.txt", "tokenizer.json", *SENTENCEPIECE_FILES)


def load_lm(path: str | Path, layers: str = "last", finetune: bool = False, bf16: bool = False) -> CharFeatures:
    """`_load_lm` of `path`, a local directory or a hub name in the local Hugging Face cache
    (`hub_cache.lm_directory`), with the terms of the directory (nerkit.pretrained.licences)
    attached, for the model directories made with it to carry."""
    directory = lm_directory(path, "embeddings.lm.path", FETCH_FIX)
    embedder = _load_lm(directory, layers, finetune, bf16)
    embedder.terms = read_terms(directory, LAC_LICENCE if _is_lac(directory) else None)
    return embedder


def _load_lm(directory: Path, layers: str = "last", finetune: bool = False, bf16: bool = False) -> CharFeatures:
    """The per-character features of a local Hugging Face directory: config.json, weights as
    model.safetensors or pytorch_model.bin (read with weights_only), and a vocabulary: one token per
    character in vocab.txt gives an `LMEmbedder`, any other tokenizer (tokenizer.json: word pieces,
    SentencePiece, byte-level BPE) a `SubwordEmbedder` aligned by offsets. Never touches a hub. A LAC
    directory (`nerkit vectors export-lac`) gives nerkit.pretrained.lac's `LACEmbedder`."""
    if _is_lac(directory):
        from nerkit.pretrained.lac_files import load_lac

        return load_lac(directory, layers=layers, finetune=finetune, bf16=bf16)
    config = _read_config(directory)
    if not character_level(directory):
        if not any((directory / name).is_file() for name in VOCABULARY_FILES):
            raise UserError(f"no vocabulary: none of {', '.join(VOCABULARY_FILES)}", where=str(directory),
                            fix=FETCH_FIX)
        tokenizer = read_tokenizer(directory)
        state, weights = _read_weights(directory)
        return SubwordEmbedder(_build_lm(config, state, weights), tokenizer, layers=layers, finetune=finetune, bf16=bf16)
    if (getattr(config, "max_position_embeddings", None) or 0) < 3:
        raise UserError("config.json has no max_position_embeddings", where=str(directory / "config.json"),
                        fix="use the config.json of a BERT-style encoder")
    vocab = LMVocab.read(directory)
    check_vocab_size(vocab, config, directory)
    state, weights = _read_weights(directory)
    return LMEmbedder(_build_lm(config, state, weights), vocab, layers=layers, finetune=finetune, bf16=bf16)


def load_sources(sources: list) -> CharFeatures | Stacked | None:
    """The features of `embeddings.lm`'s sources (nerkit.config's LMConfig, `lm_sources()`), each
    with its own options: None for none, the one LM, or a `Stacked` of them in their order."""
    loaded = [load_lm(s.path, layers=s.layers, finetune=s.finetune, bf16=s.bf16) for s in sources]
    if len(loaded) < 2:
        return loaded[0] if loaded else None
    return Stacked(loaded)


def _is_lac(directory: Path) -> bool:
    from nerkit.pretrained.lac_files import is_lac_directory

    return is_lac_directory(directory)


# ------------------------------------------------------------------------------------ save / load

def save_lm(embedder: CharFeatures | Stacked, model_dir: str | Path, weights: bool = True) -> Path:
    """Write the LM into MODEL_DIR/lm/ as a plain Hugging Face directory (config.json, vocab.txt,
    tokenizer_config.json and, with `weights`, model.safetensors with the current, possibly
    fine-tuned, weights) plus the embedder's options and scalar mix, so that `load_saved_lm`
    rebuilds it with nothing else. A nerkit model directory saves it without weights: they are in
    the tagger's own model.safetensors, which then fills the rebuilt LM. A LAC embedder writes
    its own kind of directory (`nerkit.pretrained.lac_files.save_lac`). Stacked sources each
    write theirs into a numbered subdirectory, lm/0/, lm/1/, ... in their order."""
    target = Path(model_dir) / LM_DIR
    if isinstance(embedder, Stacked):
        with atomic_directory(target) as tmp:
            for k, source in enumerate(embedder.sources):
                _save_source(source, tmp / str(k), weights)
        return target
    return _save_source(embedder, target, weights)


def _save_source(embedder: CharFeatures, target: Path, weights: bool) -> Path:
    """One language model's directory at `target` (see `save_lm`), with its terms carried."""
    _save_kind(embedder, target, weights)
    write_terms(target, embedder.terms)
    return target


def _save_kind(embedder: CharFeatures, target: Path, weights: bool) -> Path:
    if not isinstance(embedder, (LMEmbedder, SubwordEmbedder)):
        from nerkit.pretrained.lac_files import save_lac

        return save_lac(embedder, target, weights)
    if isinstance(embedder, SubwordEmbedder):
        return _save_subword(embedder, target, weights)
    vocab = embedder.vocab
    tokenizer = {"tokenizer_class": "BertTokenizer", "do_lower_case": vocab.lowercase,
                 "strip_accents": vocab.strip_accents, "tokenize_chinese_chars": True,
                 "model_max_length": embedder.lm.config.max_position_embeddings}
    options = {"layers": embedder.layers, "finetune": embedder.finetune, "bf16": embedder.bf16}
    with atomic_directory(target) as tmp:
        atomic_write_text(tmp / "config.json", embedder.lm.config.to_json_string())
        atomic_write_text(tmp / "vocab.txt", "".join(t + "\n" for t in vocab.tokens))
        atomic_write_text(tmp / "tokenizer_config.json", json.dumps(tokenizer, indent=2) + "\n")
        atomic_write_text(tmp / OPTIONS_FILE, json.dumps(options, indent=2) + "\n")
        if weights:
            _write_weights(tmp, embedder)
    return target


def _save_subword(embedder: SubwordEmbedder, target: Path, weights: bool) -> Path:
    """A subword LM's lm/: config.json, the tokenizer's own files, the options (kind: subword) and,
    with `weights`, model.safetensors and the scalar mix."""
    options = {"kind": SubwordEmbedder.kind, "layers": embedder.layers, "finetune": embedder.finetune,
               "bf16": embedder.bf16}
    with atomic_directory(target) as tmp:
        atomic_write_text(tmp / "config.json", embedder.lm.config.to_json_string())
        embedder.tokenizer.save_pretrained(str(tmp))
        atomic_write_text(tmp / OPTIONS_FILE, json.dumps(options, indent=2) + "\n")
        if weights:
            _write_weights(tmp, embedder)
    return target


def _write_weights(tmp: Path, embedder: CharFeatures) -> None:
    state = {k: v.detach().cpu().contiguous() for k, v in embedder.lm.state_dict().items()}
    atomic_write_bytes(tmp / "model.safetensors", safetensors_bytes(state, metadata={"format": "pt"}))
    if embedder.scalar_mix is not None:
        mix = {k: v.detach().cpu().contiguous() for k, v in embedder.scalar_mix.state_dict().items()}
        atomic_write_bytes(tmp / MIX_FILE, safetensors_bytes(mix))


# The fix for any file of a model directory's lm/ that cannot be read: nerkit wrote it with the model,
# so fetching or exporting a language model again (the fixes for an LM directory) would not help.
SAVED_LM_FIX = "the model directory's lm/ is damaged: copy the whole model directory again, or train the model again"


def load_saved_lm(model_dir: str | Path, sources: int | None = None) -> CharFeatures | Stacked:
    """The embedder that `save_lm` wrote into MODEL_DIR/lm/ (a `Stacked` of lm/0/, lm/1/, ... when
    its sources were stacked); saved without weights, its weights are left as built (the caller
    loads them, as a nerkit model directory does from model.safetensors). `sources`: how many the
    model's config lists, when known. An error about a file in lm/ names `SAVED_LM_FIX`."""
    directory = Path(model_dir) / LM_DIR
    try:
        stacked = stacked_directories(directory)
        found = max(1, len(stacked))
        if sources is not None and found != sources:
            raise ModelDirError(f"lm/ holds {found} language model(s) but config.yaml lists {sources}",
                                where=str(directory), fix=SAVED_LM_FIX)
        if stacked:
            return Stacked([_load_saved_lm(source) for source in stacked])
        return _load_saved_lm(directory)
    except UserError as e:
        if not (e.where and Path(re.sub(r":\d+$", "", e.where)).is_relative_to(directory)):
            raise  # not about lm/'s files (a missing `transformers` package)
        raise ModelDirError(e.message, where=e.where, fix=SAVED_LM_FIX) from None


def stacked_directories(directory: Path) -> list[Path]:
    """A saved lm/'s numbered source directories (0, 1, ...) when it holds a stack; [] for one LM."""
    if (directory / OPTIONS_FILE).is_file():
        return []
    found = []
    while (directory / str(len(found))).is_dir():
        found.append(directory / str(len(found)))
    return found


def _load_saved_lm(directory: Path) -> CharFeatures:
    options_path = directory / OPTIONS_FILE
    if not options_path.is_file():
        raise UserError(f"{OPTIONS_FILE} not found", where=str(directory),
                        fix="the model directory's language model is incomplete; save it again")
    options = _read_optional_json(options_path)
    try:
        layers, finetune, bf16 = options["layers"], bool(options["finetune"]), bool(options.get("bf16", False))
    except KeyError as e:
        raise UserError(f"{OPTIONS_FILE} lacks {e}", where=str(options_path), fix="save the model again") from None
    weights = (directory / "model.safetensors").is_file()
    if _is_lac(directory):
        from nerkit.pretrained.lac_files import load_lac

        embedder = load_lac(directory, layers=layers, finetune=finetune, bf16=bf16, weights=weights)
    elif weights:
        embedder = load_lm(directory, layers=layers, finetune=finetune, bf16=bf16)
    elif options.get("kind") == SubwordEmbedder.kind:
        embedder = SubwordEmbedder(_build_lm(_read_config(directory)), read_tokenizer(directory), layers=layers,
                                   finetune=finetune, bf16=bf16)
    else:
        config = _read_config(directory)
        embedder = LMEmbedder(_build_lm(config), LMVocab.read(directory), layers=layers, finetune=finetune, bf16=bf16)
    embedder.terms = read_terms(directory)
    if not weights:
        return embedder
    if embedder.scalar_mix is not None:
        load_checked(embedder.scalar_mix, read_safetensors(directory / MIX_FILE, fix="save the model again"),
                     f"{MIX_FILE} does not fit the language model's layers", where=str(directory / MIX_FILE), fix="save the model again")
    return embedder
