"""Language-model features: a character-level Chinese encoder (BERT, RoBERTa-wwm, MacBERT style) read
from a local Hugging Face directory, one LM token per character so offsets stay exact, with windows
for long sentences, a learned scalar mix of layers, a self-contained save/load and a disk cache of
frozen features. `transformers` is imported only inside the functions that build a model. A
directory exported from Baidu's LAC (model_type lac-bigru) loads as nerkit.lac's bi-GRU instead.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import unicodedata
import zipfile
from contextlib import contextmanager
from pathlib import Path
from pickle import UnpicklingError  # the error torch.load(weights_only=True) raises for objects

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from torch import nn

from nerkit.corpus import normalize_char
from nerkit.errors import UserError
from nerkit.files import WRITE_ERRNOS, atomic_directory, atomic_write_bytes, atomic_write_text

LAYERS = ("last", "mix")
LM_DIR = "lm"  # the subdirectory of a model directory that holds its language model
OPTIONS_FILE = "nerkit_lm.json"
MIX_FILE = "mix.safetensors"
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
# Whitespace has no token in a BERT vocabulary (its tokenizer drops it); it becomes this reserved
# token, a trained-from-scratch slot that keeps spaces apart from unknown characters.
SPACE_TOKEN = "[unused1]"
# Below this share of one-character entries (after removing "##") a vocabulary is word pieces.
MIN_CHAR_SHARE = 0.5
CACHE_FORMAT = 1
FETCH_FIX = ("run `make lm` for lm/m3e-small (or `make lac` for lm/lac-small), or give a local Hugging Face "
             "directory of a character-level encoder")


# ------------------------------------------------------------------------------------ vocabulary

class CharVocab:
    """One id per character, memoised: a subclass says how a character is looked up (`_lookup`)
    and what decides its ids (`_identity`, JSON-able, hashed by `fingerprint`)."""

    def __init__(self):
        self._memo: dict[str, int] = {}

    def _lookup(self, char: str) -> int:
        raise NotImplementedError

    def _identity(self) -> list:
        raise NotImplementedError

    def id(self, char: str) -> int:
        known = self._memo.get(char)
        if known is None:
            known = self._memo[char] = self._lookup(char)
        return known

    def ids(self, chars: list[str]) -> list[int]:
        """One id per character, with no [CLS]/[SEP] (the embedder adds them per window)."""
        return [self.id(c) for c in chars]

    def fingerprint(self) -> str:
        text = json.dumps(self._identity(), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


class LMVocab(CharVocab):
    """A BERT vocab.txt read as one token per character.

    A character is looked up as the LM's tokenizer would see it (lower-cased and accent-stripped
    when the tokenizer does so); if that is missing, as its NFKC form (full-width -> ASCII); if that
    is missing too, lower-cased (a vocabulary without upper-case letters is uncased whatever its
    tokenizer_config says); else it is [UNK]. So 'Ａ' -> 'a' in an uncased vocabulary without 'ａ'.
    Whitespace, which the tokenizer would drop, becomes `SPACE_TOKEN` ([UNK] if the vocab lacks it).
    A character is never split into word pieces, and never read as a "##" continuation.
    """

    def __init__(self, tokens: list[str], lowercase: bool, strip_accents: bool | None = None, where: str = "vocab"):
        super().__init__()
        if not tokens:
            raise UserError("the vocabulary is empty", where=where, fix=FETCH_FIX)
        self.tokens = tokens
        self.index = {t: i for i, t in enumerate(tokens)}  # a repeated token keeps its last id, as in BertTokenizer
        missing = [s for s in SPECIALS if s not in self.index]
        if missing:
            raise UserError(f"the vocabulary lacks {', '.join(missing)}", where=where,
                            fix="use a BERT-style vocab.txt ([PAD], [UNK], [CLS], [SEP] and one line per token)")
        pieces = [t[2:] if t.startswith("##") else t for t in tokens if not (t.startswith("[") and t.endswith("]"))]
        share = sum(len(p) == 1 for p in pieces) / max(1, len(pieces))
        if share < MIN_CHAR_SHARE:
            raise UserError(f"not a character-level vocabulary: only {share:.0%} of its entries are single characters",
                            where=where, fix="use a Chinese character-level encoder (BERT/RoBERTa-wwm/MacBERT); "
                                             "word-piece vocabularies would break one token per character")
        self.lowercase = lowercase
        self.strip_accents = lowercase if strip_accents is None else strip_accents  # BertTokenizer's default
        self.pad_id, self.unk_id, self.cls_id, self.sep_id = (self.index[s] for s in SPECIALS)
        self.space_id = self.index.get(SPACE_TOKEN, self.unk_id)

    @classmethod
    def read(cls, directory: Path) -> "LMVocab":
        """vocab.txt, with the lower-casing of tokenizer_config.json (or tokenizer.json's normalizer;
        BertTokenizer lower-cases when neither says)."""
        path = directory / "vocab.txt"
        if not path.is_file():
            raise UserError("vocab.txt not found", where=str(directory), fix=FETCH_FIX)
        try:
            tokens = [line.rstrip("\n") for line in path.read_text(encoding="utf-8").split("\n")]
        except UnicodeDecodeError:
            raise UserError("vocab.txt is not UTF-8 text", where=str(path), fix=FETCH_FIX) from None
        if tokens and tokens[-1] == "":
            tokens.pop()  # the final newline
        lowercase, strip_accents = True, None
        normalizer = _read_optional_json(directory / "tokenizer.json").get("normalizer") or {}
        if "lowercase" in normalizer:
            lowercase, strip_accents = bool(normalizer["lowercase"]), normalizer.get("strip_accents")
        settings = _read_optional_json(directory / "tokenizer_config.json")
        if "do_lower_case" in settings:
            lowercase, strip_accents = bool(settings["do_lower_case"]), settings.get("strip_accents")
        return cls(tokens, lowercase, strip_accents, where=str(path))

    def _tokenizer_form(self, char: str) -> str:
        if self.lowercase:
            char = char.lower()
        if self.strip_accents:
            char = "".join(c for c in unicodedata.normalize("NFD", char) if unicodedata.category(c) != "Mn")
        return char

    def _lookup(self, char: str) -> int:
        if char.isspace():
            return self.space_id
        folded = normalize_char(char)
        candidates = (self._tokenizer_form(char), self._tokenizer_form(folded), char.lower(), folded.lower())
        return next((self.index[c] for c in candidates if c in self.index), self.unk_id)

    def _identity(self) -> list:
        return [self.tokens, self.lowercase, self.strip_accents, SPACE_TOKEN]

    def __len__(self) -> int:
        return len(self.tokens)


def _read_optional_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError("not valid JSON", where=str(path), fix="repair or remove the file") from None
    return data if isinstance(data, dict) else {}


# ------------------------------------------------------------------------------------ windows

def windows(length: int, size: int) -> list[tuple[int, int, int, int]]:
    """Overlapping windows of at most `size` characters over a sentence of `length`, each as
    (start, end, take_start, take_end): the window covers [start, end) and supplies the features of
    [take_start, take_end), the characters for which it is the window where they are most central
    (the earlier window on a tie). Windows advance by half their size; the last one ends the sentence.
    """
    if length <= size:
        return [(0, length, 0, length)]
    stride = max(1, size // 2)
    starts = list(range(0, length - size, stride)) + [length - size]
    centres = [s + (size - 1) / 2 for s in starts]
    # Centres increase, so each window takes one run, cut halfway between neighbouring centres.
    cuts = [0] + [math.floor((a + b) / 2) + 1 for a, b in zip(centres, centres[1:])] + [length]
    return [(s, s + size, cuts[k], cuts[k + 1]) for k, s in enumerate(starts)]


# ------------------------------------------------------------------------------------ the module

class ScalarMix(nn.Module):
    """ELMo's learned mix of layers: gamma * sum_k softmax(w)_k * h_k (as in AllenNLP)."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, stack: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.weights, dim=0)  # (S,)
        return self.gamma * torch.einsum("btsd,s->btd", stack, weights)  # (B, T, D)


class CharFeatures(nn.Module):
    """A pretrained encoder `lm` read as per-character features: what `LMEmbedder` and nerkit.lac's
    `LACEmbedder` share. A subclass defines `states`, the encoder's S layer states of width
    `output_dim` per character; `combine` reduces them to one feature per character.

    `layers`: "last" (the top layer) or "mix" (a learned scalar mix of the embeddings and every
    layer). `finetune`: train the LM's weights; when False the LM stays in eval mode and runs under
    no_grad (the scalar mix, if any, still learns). `bf16`: run the LM under bf16 autocast.
    """

    def __init__(self, lm: nn.Module, vocab: CharVocab, layers: str, finetune: bool, bf16: bool,
                 num_layers: int, output_dim: int):
        super().__init__()
        if layers not in LAYERS:
            raise UserError(f"unknown LM layers option {layers!r}", fix=f"use one of {', '.join(LAYERS)}")
        self.lm, self.vocab = lm, vocab
        self.layers, self.finetune, self.bf16 = layers, finetune, bf16
        self.num_states = num_layers + 1 if layers == "mix" else 1
        self.output_dim = output_dim
        self.scalar_mix = ScalarMix(self.num_states) if layers == "mix" else None
        self.lm.requires_grad_(finetune)
        self.train(False)  # ready for inference, as Hugging Face's from_pretrained leaves a model

    def train(self, mode: bool = True) -> "CharFeatures":
        super().train(mode)
        if not self.finetune:
            self.lm.eval()  # a frozen LM never drops out, whatever the model around it does
        return self

    def forward(self, lm_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """lm_ids (B, T) long per character, no [CLS]/[SEP]; mask (B, T) bool, left-aligned.
        Returns (B, T, output_dim), zero at padding."""
        return self.combine(self.states(lm_ids, mask))

    def states(self, lm_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T, S, D) float32 layer states, zero at padding: S = 1 for "last", else the embeddings
        and each layer."""
        raise NotImplementedError

    def combine(self, stack: torch.Tensor) -> torch.Tensor:
        """(B, T, S, D) layer states, from `states` or `cached_features` -> (B, T, D)."""
        if self.scalar_mix is None:
            return stack[:, :, -1]  # (B, T, D)
        return self.scalar_mix(stack)

    def fingerprint(self) -> str:
        """A checksum of everything that decides the features: config, vocabulary, weights."""
        digest = hashlib.sha256()
        digest.update(json.dumps(self.lm.config.to_dict(), sort_keys=True, default=str).encode("utf-8"))
        digest.update(self.vocab.fingerprint().encode("ascii"))
        for name, tensor in sorted(self.lm.state_dict().items()):
            digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}".encode("utf-8"))
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy())
        return digest.hexdigest()


class LMEmbedder(CharFeatures):
    """A Hugging Face encoder's per-character features; sentences longer than its positions are
    read in overlapping windows (`windows`)."""

    def __init__(self, lm: nn.Module, vocab: LMVocab, layers: str = "last", finetune: bool = False,
                 bf16: bool = False):
        config = lm.config
        super().__init__(lm, vocab, layers, finetune, bf16, num_layers=config.num_hidden_layers,
                         output_dim=config.hidden_size)
        self.window = config.max_position_embeddings - 2  # characters per window, beside [CLS] and [SEP]

    def states(self, lm_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The LM's layer states per character: (B, T, S, D) float32, S = 1 for "last", else the
        embeddings and each layer. Each sentence is cut into windows (`windows`); all windows of
        the batch run as one LM batch, and each character is gathered from its window."""
        B, T = lm_ids.shape
        lengths = mask.sum(dim=1).tolist()
        rows, places = [], []  # places: (sentence, take_start, take_end, row, window start)
        for b, n in enumerate(lengths):
            ids = lm_ids[b, :n].tolist()
            for start, end, take_start, take_end in windows(n, self.window):
                places.append((b, take_start, take_end, len(rows), start))
                rows.append([self.vocab.cls_id] + ids[start:end] + [self.vocab.sep_id])
        if not rows:
            return torch.zeros(B, T, self.num_states, self.output_dim, device=lm_ids.device)
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.vocab.pad_id, dtype=torch.long)  # (R, W)
        attention = torch.zeros(len(rows), width, dtype=torch.long)  # (R, W)
        source = torch.zeros(B, T, dtype=torch.long)  # (B, T): where each character's states are in the flat rows
        for r, row in enumerate(rows):
            input_ids[r, :len(row)] = torch.tensor(row)
            attention[r, :len(row)] = 1
        for b, take_start, take_end, r, start in places:
            # character i sits at position 1 + i - start of its row, after [CLS]
            source[b, take_start:take_end] = r * width + 1 - start + torch.arange(take_start, take_end)
        device = lm_ids.device
        stack = self._run(input_ids.to(device), attention.to(device))  # (R, W, S, D)
        picked = stack.reshape(-1, self.num_states, self.output_dim)[source.to(device)]  # (B, T, S, D)
        return torch.where(mask[:, :, None, None], picked, picked.new_zeros(()))  # (B, T, S, D), inert padding

    def _run(self, input_ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """input_ids, attention (R, W) -> layer states (R, W, S, D) float32."""
        grad = self.finetune and torch.is_grad_enabled()
        with torch.set_grad_enabled(grad), torch.autocast(input_ids.device.type, dtype=torch.bfloat16,
                                                          enabled=self.bf16):
            out = self.lm(input_ids=input_ids, attention_mask=attention,
                          output_hidden_states=self.layers == "mix")
        states = out.hidden_states if self.layers == "mix" else (out.last_hidden_state,)
        return torch.stack(states, dim=2).float()  # (R, W, S, D)


# ------------------------------------------------------------------------------------ loading

def load_lm(path: str | Path, layers: str = "last", finetune: bool = False, bf16: bool = False) -> CharFeatures:
    """An `LMEmbedder` from a local Hugging Face directory: config.json, vocab.txt and weights as
    model.safetensors or pytorch_model.bin (read with weights_only). Never touches a hub. A LAC
    directory (`nerkit vectors export-lac`) gives nerkit.lac's `LACEmbedder`."""
    directory = Path(path)
    if not directory.is_dir():
        raise UserError("language-model directory not found", where=str(directory), fix=FETCH_FIX)
    if _is_lac(directory):
        from nerkit.lac import load_lac

        return load_lac(directory, layers=layers, finetune=finetune, bf16=bf16)
    config = _read_config(directory)
    vocab = LMVocab.read(directory)
    if len(vocab) > config.vocab_size:
        raise UserError(f"vocab.txt has {len(vocab)} tokens but config.json's vocab_size is {config.vocab_size}",
                        where=str(directory / "vocab.txt"), fix="use the vocab.txt and config.json of the same model")
    state, weights = _read_weights(directory)
    return LMEmbedder(_build_lm(config, state, weights), vocab, layers=layers, finetune=finetune, bf16=bf16)


def _read_config(directory: Path):
    path = directory / "config.json"
    if not path.is_file():
        raise UserError("config.json not found", where=str(directory), fix=FETCH_FIX)
    try:
        config = _transformers().AutoConfig.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"not a usable model config ({_gist(e)})", where=str(path),
                        fix="use the config.json of a BERT-style encoder, or a LAC directory from "
                            "`nerkit vectors export-lac`") from None
    needed = ("hidden_size", "num_hidden_layers", "max_position_embeddings", "vocab_size")
    if getattr(config, "is_encoder_decoder", False) or any(not hasattr(config, k) for k in needed):
        raise UserError(f"config.json is not a BERT-style encoder (model_type {config.model_type!r})", where=str(path),
                        fix="use a character-level Chinese encoder such as BERT, RoBERTa-wwm or MacBERT, or a "
                            "LAC directory from `nerkit vectors export-lac`")
    if config.max_position_embeddings < 3:
        raise UserError("max_position_embeddings leaves no room for characters beside [CLS] and [SEP]",
                        where=str(path), fix="use the config.json of a real encoder")
    return config


def _is_lac(directory: Path) -> bool:
    from nerkit.lac import is_lac_directory

    return is_lac_directory(directory)


def _read_weights(directory: Path) -> tuple[dict[str, torch.Tensor], Path]:
    safetensors_path, pickle_path = directory / "model.safetensors", directory / "pytorch_model.bin"
    if safetensors_path.is_file():
        try:
            return load_file(str(safetensors_path), device="cpu"), safetensors_path
        except (SafetensorError, OSError) as e:
            raise UserError(f"model.safetensors cannot be read ({_gist(e)})", where=str(safetensors_path),
                            fix="the file is damaged or not safetensors; copy or convert it again") from None
    if pickle_path.is_file():
        try:
            state = torch.load(pickle_path, weights_only=True, map_location="cpu")
        except UnpicklingError:
            raise UserError("pytorch_model.bin holds objects other than tensors, which are not loaded",
                            where=str(pickle_path), fix="convert it to model.safetensors where you trust it") from None
        except (RuntimeError, EOFError, ValueError, OSError, zipfile.BadZipFile) as e:
            raise UserError(f"pytorch_model.bin cannot be read ({_gist(e)})", where=str(pickle_path),
                            fix="the file is damaged; copy it again") from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise UserError("pytorch_model.bin is not a state dict of tensors", where=str(pickle_path),
                            fix="save the model's state_dict(), or convert it to model.safetensors")
        return state, pickle_path
    if any(directory.glob("*.index.json")):
        raise UserError("sharded weights are not supported", where=str(directory),
                        fix="merge the shards into one model.safetensors")
    raise UserError("no model.safetensors or pytorch_model.bin", where=str(directory), fix=FETCH_FIX)


def _build_lm(config, state: dict[str, torch.Tensor] | None = None, weights: Path | None = None) -> nn.Module:
    """The encoder of `config` (no pooler) with `state` loaded into it (None: as built). Checkpoints
    of a pretraining head ("bert.encoder...", "cls.predictions...") and TF-era LayerNorm names
    (gamma/beta) are accepted; the heads are dropped."""
    AutoModel = _transformers().AutoModel
    try:
        try:
            lm = AutoModel.from_config(config, add_pooling_layer=False)
        except TypeError:  # encoders without a pooler take no such option
            lm = AutoModel.from_config(config)
    except (ValueError, KeyError) as e:
        raise UserError(f"cannot build the model of config.json ({_gist(e)})",
                        where=str(getattr(config, "_name_or_path", "") or "config.json"),
                        fix="use a BERT-style encoder config") from None
    if state is None:
        return lm
    expected = lm.state_dict()
    renamed = {_modern_name(k): v for k, v in state.items()}
    prefix = lm.base_model_prefix + "."
    if sum(k.startswith(prefix) for k in renamed) > sum(k in expected for k in renamed):
        renamed = {k[len(prefix):]: v for k, v in renamed.items() if k.startswith(prefix)}
    missing = [k for k in expected if k not in renamed]
    if missing:
        raise UserError(f"the weights lack {len(missing)} tensors of config.json's model, e.g. {missing[0]}",
                        where=str(weights), fix="use the weights and config.json of the same model")
    wrong = [f"{k} {tuple(renamed[k].shape)} != {tuple(v.shape)}" for k, v in expected.items()
             if renamed[k].shape != v.shape]
    if wrong:
        raise UserError(f"the weights do not fit config.json: {wrong[0]}", where=str(weights),
                        fix="use the weights and config.json of the same model")
    lm.load_state_dict({k: renamed[k] for k in expected})
    return lm


def _transformers():
    try:
        import transformers
    except ImportError:
        raise UserError("the language-model features need the transformers package",
                        fix='install nerkit with its "lm" extra: `make install`, or pip install -e ".[lm]"') from None
    return transformers


def _gist(error: Exception) -> str:
    """The first sentence of a library's error message."""
    text = str(error).strip()
    if not text:
        return type(error).__name__
    return text.splitlines()[0].split(". ")[0].rstrip(".")


def _modern_name(name: str) -> str:
    if ".LayerNorm." in name or name.startswith("LayerNorm."):
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
    return name


# ------------------------------------------------------------------------------------ save / load

def save_lm(embedder: CharFeatures, model_dir: str | Path, weights: bool = True) -> Path:
    """Write the LM into MODEL_DIR/lm/ as a plain Hugging Face directory (config.json, vocab.txt,
    tokenizer_config.json and, with `weights`, model.safetensors with the current, possibly
    fine-tuned, weights) plus the embedder's options and scalar mix, so that `load_saved_lm`
    rebuilds it with nothing else. A nerkit model directory saves it without weights: they are in
    the tagger's own model.safetensors, which then fills the rebuilt LM. A LAC embedder writes
    its own kind of directory (`nerkit.lac.save_lac`)."""
    if not isinstance(embedder, LMEmbedder):
        from nerkit.lac import save_lac

        return save_lac(embedder, model_dir, weights)
    target = Path(model_dir) / LM_DIR
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
            state = {k: v.detach().cpu().contiguous() for k, v in embedder.lm.state_dict().items()}
            atomic_write_bytes(tmp / "model.safetensors", safetensors_bytes(state, metadata={"format": "pt"}))
            if embedder.scalar_mix is not None:
                mix = {k: v.detach().cpu().contiguous() for k, v in embedder.scalar_mix.state_dict().items()}
                atomic_write_bytes(tmp / MIX_FILE, safetensors_bytes(mix))
    return target


def load_saved_lm(model_dir: str | Path) -> CharFeatures:
    """The embedder that `save_lm` wrote into MODEL_DIR/lm/; saved without weights, its weights are
    left as built (the caller loads them, as a nerkit model directory does from model.safetensors)."""
    directory = Path(model_dir) / LM_DIR
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
        from nerkit.lac import load_lac

        embedder = load_lac(directory, layers=layers, finetune=finetune, bf16=bf16, weights=weights)
    elif weights:
        embedder = load_lm(directory, layers=layers, finetune=finetune, bf16=bf16)
    else:
        config = _read_config(directory)
        embedder = LMEmbedder(_build_lm(config), LMVocab.read(directory), layers=layers, finetune=finetune, bf16=bf16)
    if not weights:
        return embedder
    if embedder.scalar_mix is not None:
        try:
            embedder.scalar_mix.load_state_dict(load_file(str(directory / MIX_FILE), device="cpu"))
        except (SafetensorError, OSError, RuntimeError) as e:
            raise UserError(f"{MIX_FILE} cannot be read ({_gist(e)})", where=str(directory / MIX_FILE),
                            fix="save the model again") from None
    return embedder


# ------------------------------------------------------------------------------------ feature cache

def cached_features(embedder: CharFeatures, token_lists: list[list[str]], cache_dir: str | Path,
                    batch_size: int = 32, progress: bool = False) -> list[torch.Tensor]:
    """The frozen LM's layer states of each sentence, (T_i, S, D) float16, computed once per corpus.

    The features live in CACHE_DIR/<key>/features.safetensors, memory-mapped (pages are read when
    used), the key made of the LM's checksum (config, vocabulary, weights), the layers option, bf16
    and the corpus text. A batch of them, padded to (B, T, S, D) and made float, goes through
    `embedder.combine` (the scalar mix still learns). Storage: 2 * S * D bytes per character.
    """
    if embedder.finetune:
        raise ValueError("a fine-tuned LM changes every step: cache only a frozen one (finetune=False)")
    parts = {"format": CACHE_FORMAT, "lm_sha256": embedder.fingerprint(), "layers": embedder.layers,
             "bf16": embedder.bf16, "corpus_sha256": corpus_checksum(token_lists)}
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode("ascii")).hexdigest()
    entry = Path(cache_dir) / key
    features = _read_cache(entry, len(token_lists))
    if features is not None:
        return features
    try:
        with _taking_turns(entry):  # another process may have written it meanwhile
            features = _read_cache(entry, len(token_lists))
            if features is None:
                with atomic_directory(entry) as tmp:
                    _write_cache(tmp / "features.safetensors", embedder, token_lists, batch_size, progress)
                    atomic_write_text(tmp / "info.json", json.dumps({**parts, "sentences": len(token_lists)}, indent=2))
    except OSError as e:
        if e.errno in WRITE_ERRNOS:
            raise UserError(f"cannot write the LM feature cache ({e.strerror})", where=str(entry),
                            fix="free disk space or choose another cache directory") from None
        raise
    return features if features is not None else _read_cache(entry, len(token_lists))


@contextmanager
def _taking_turns(entry: Path):
    """Processes that miss the same cache entry (the ranks of a distributed run on one machine,
    benchmark runs side by side) take turns on a lock of the cache directory: the first computes
    the entry, the others then read it, and none removes another's half-written copy. Where the
    file system cannot lock a directory (some network mounts) they go on without turns."""
    import fcntl  # POSIX: nerkit trains on Linux and macOS

    entry.parent.mkdir(parents=True, exist_ok=True)
    directory = os.open(entry.parent, os.O_RDONLY)
    try:
        try:
            fcntl.flock(directory, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(directory)  # and the lock with it


def corpus_checksum(token_lists: list[list[str]]) -> str:
    digest = hashlib.sha256()
    for tokens in token_lists:
        digest.update("\x1f".join(tokens).encode("utf-8", "surrogatepass") + b"\x1e")
    return digest.hexdigest()


def _write_cache(path: Path, embedder: CharFeatures, token_lists: list[list[str]], batch_size: int,
                 progress: bool) -> None:
    """Stream a safetensors file: header, sentence offsets, then the features of chunks of
    sentences (length-sorted within a chunk for little padding, written in corpus order)."""
    lengths = [len(t) for t in token_lists]
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype("<i8")  # (N + 1,)
    shape = [int(offsets[-1]), embedder.num_states, embedder.output_dim]
    size = 2 * shape[0] * shape[1] * shape[2]
    header = {"offsets": {"dtype": "I64", "shape": [len(offsets)], "data_offsets": [0, offsets.nbytes]},
              "features": {"dtype": "F16", "shape": shape, "data_offsets": [offsets.nbytes, offsets.nbytes + size]}}
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)
    chunk = batch_size * 16
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(token_lists), desc="LM features", unit="sent")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.write(offsets.tobytes())
        for first in range(0, len(token_lists), chunk):
            indices = range(first, min(first + chunk, len(token_lists)))
            found: dict[int, torch.Tensor] = {}
            for batch in _length_batches(indices, lengths, batch_size):
                for i, states in zip(batch, _batch_states(embedder, [token_lists[i] for i in batch])):
                    found[i] = states
            for i in indices:
                f.write(found[i].to(torch.float16).numpy().tobytes())
            if bar is not None:
                bar.update(len(indices))
    if bar is not None:
        bar.close()


def _length_batches(indices: range, lengths: list[int], batch_size: int) -> list[list[int]]:
    ordered = sorted(indices, key=lambda i: lengths[i])
    return [ordered[k:k + batch_size] for k in range(0, len(ordered), batch_size)]


@torch.no_grad()
def _batch_states(embedder: CharFeatures, sentences: list[list[str]]) -> list[torch.Tensor]:
    """Layer states of each sentence, (T_i, S, D), on the CPU."""
    device = next(embedder.lm.parameters()).device
    width = max(1, max(len(s) for s in sentences))
    lm_ids = torch.full((len(sentences), width), embedder.vocab.pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros(len(sentences), width, dtype=torch.bool)  # (B, T)
    for b, chars in enumerate(sentences):
        lm_ids[b, :len(chars)] = torch.tensor(embedder.vocab.ids(chars), dtype=torch.long)
        mask[b, :len(chars)] = True
    stack = embedder.states(lm_ids.to(device), mask.to(device)).cpu()  # (B, T, S, D)
    return [stack[b, :len(chars)] for b, chars in enumerate(sentences)]


def _read_cache(entry: Path, sentences: int) -> list[torch.Tensor] | None:
    """The features of a complete cache entry, memory-mapped; None when absent or unreadable."""
    path = entry / "features.safetensors"
    try:
        with open(path, "rb") as f:
            (header_size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_size))
        start = 8 + header_size
        offsets_at, features_at = header["offsets"]["data_offsets"], header["features"]["data_offsets"]
        shape = tuple(header["features"]["shape"])
        if header["offsets"]["shape"] != [sentences + 1] or path.stat().st_size != start + features_at[1]:
            return None
        offsets = np.fromfile(path, dtype="<i8", count=sentences + 1, offset=start + offsets_at[0]).tolist()
        if shape[0] == 0:
            features = torch.zeros(shape, dtype=torch.float16)
        else:
            # copy-on-write: the tensors are writable in memory, the file never changes
            mapped = np.memmap(path, dtype="<f2", mode="c", offset=start + features_at[0], shape=shape)
            features = torch.from_numpy(mapped)  # (N_chars, S, D)
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    return [features[a:b] for a, b in zip(offsets, offsets[1:])]
