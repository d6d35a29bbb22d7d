"""Hugging Face language models as character features: a character-level Chinese encoder (BERT,
RoBERTa-wwm, MacBERT style) read from a local directory, one LM token per character so offsets stay
exact, its vocabulary checked and its weights read from safetensors (or a `pytorch_model.bin` with
weights_only=True). `transformers` is imported only inside the functions that build a model; the
shared module is nerkit.pretrained.base's, and nerkit.pretrained.loading chooses between this and LAC.
"""

from __future__ import annotations

import unicodedata
import zipfile
from pathlib import Path
from pickle import (
    UnpicklingError,  # the error torch.load(weights_only=True) raises for objects
)

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from nerkit.data.text import normalize_char
from nerkit.errors import UserError
from nerkit.pretrained.base import (
    CharFeatures,
    CharVocab,
    _gist,
    _read_optional_json,
    lm_windows,
)
from nerkit.weights import load_checked

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")


# Whitespace has no token in a BERT vocabulary (its tokenizer drops it); it becomes this reserved
# token, a trained-from-scratch slot that keeps spaces apart from unknown characters.
SPACE_TOKEN = "[unused1]"


# Below this share of one-character entries (after removing "##") a vocabulary is word pieces.
MIN_CHAR_SHARE = 0.5


# A vocab.txt with fewer lines than this share of config.json's vocab_size is taken for a truncated
# copy (vocabularies padded to a round vocab_size stay well above it).
MIN_VOCAB_SHARE = 0.9


FETCH_FIX = ("run `make lm` for lm/m3e-small (or `make lac` for lm/lac-small), or give a local Hugging Face "
             "directory of a character-level encoder")


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


def character_level(directory: Path) -> bool:
    """Whether the directory's vocab.txt is one token per character (read by `LMVocab`); a
    directory without one, or with word pieces, is read through its tokenizer (nerkit.pretrained.subword)."""
    path = directory / "vocab.txt"
    if not path.is_file():
        return False
    try:
        tokens = path.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError:
        return True  # LMVocab.read names the problem
    pieces = [t[2:] if t.startswith("##") else t for t in tokens if t and not (t.startswith("[") and t.endswith("]"))]
    return sum(len(p) == 1 for p in pieces) >= MIN_CHAR_SHARE * max(1, len(pieces))


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
            for start, end, take_start, take_end in lm_windows(n, self.window):
                places.append((b, take_start, take_end, len(rows), start))
                rows.append([self.vocab.cls_id] + ids[start:end] + [self.vocab.sep_id])
        if not rows:
            return torch.zeros(B, T, self.num_states, self.output_dim, device=lm_ids.device)
        # As wide as the batch allows, not as its longest row: a prediction batch's T comes from a
        # few sizes (features.batch.collate_padded), and so does the LM's, whose kernels (oneDNN's,
        # under bf16) are cached per shape; the extra positions are masked.
        width = max(max(len(r) for r in rows), min(T, self.window) + 2)
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
    needed = ("hidden_size", "num_hidden_layers", "vocab_size")  # XLNet's names map onto these too
    if getattr(config, "is_encoder_decoder", False) or any(not hasattr(config, k) for k in needed):
        raise UserError(f"config.json is not a BERT-style encoder (model_type {config.model_type!r})", where=str(path),
                        fix="use a character-level Chinese encoder such as BERT, RoBERTa-wwm or MacBERT, or a "
                            "LAC directory from `nerkit vectors export-lac`")
    if 0 < (getattr(config, "max_position_embeddings", None) or 3) < 3:  # XLNet: -1, no limit
        raise UserError("max_position_embeddings leaves no room for characters beside [CLS] and [SEP]",
                        where=str(path), fix="use the config.json of a real encoder")
    return config


def check_vocab_size(vocab: LMVocab, config, directory: Path) -> None:
    """Refuse a vocab.txt that does not fit config.json's vocab_size: more tokens would give ids past
    the embedding table, far fewer means a truncated copy (its missing characters would all read as
    [UNK], silently)."""
    size, declared = len(vocab), config.vocab_size
    if size > declared:
        problem = f"vocab.txt has {size:,} tokens but config.json's vocab_size is {declared:,}: ids would overflow"
    elif size < MIN_VOCAB_SHARE * declared:
        problem = (f"vocab.txt has {size:,} tokens but config.json's vocab_size is {declared:,} "
                   f"({size / declared:.0%}): vocab.txt looks truncated")
    else:
        return
    raise UserError(problem, where=str(directory / "vocab.txt"),
                    fix="copy vocab.txt again, whole, or use the vocab.txt and config.json of the same model")


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
    load_checked(lm, renamed, "the weights do not fit config.json's model", where=str(weights),
                 fix="use the weights and config.json of the same model", extra_ok=True)  # heads are dropped
    return lm


def _transformers():
    try:
        import transformers
    except ImportError:
        raise UserError("the language-model features need the transformers package",
                        fix='install nerkit with its "lm" extra: `make install`, or pip install -e ".[lm]"') from None
    return transformers


def _modern_name(name: str) -> str:
    if ".LayerNorm." in name or name.startswith("LayerNorm."):
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
    return name
