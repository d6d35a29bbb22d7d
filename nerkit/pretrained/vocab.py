"""Language models' character vocabularies, without torch: one id per character (`CharVocab`) and a
BERT vocab.txt read that way (`LMVocab`). The featuriser looks characters up here, in training and in
the ONNX runtime, which predicts without loading torch (nerkit.inference.onnx_runtime)."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from pathlib import Path

from nerkit.data.text import normalize_char
from nerkit.errors import UserError


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


def _read_optional_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError("not valid JSON", where=str(path), fix="repair or remove the file") from None
    return data if isinstance(data, dict) else {}


LM_DIR = "lm"  # the subdirectory of a model directory that holds its language model


SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")


# Whitespace has no token in a BERT vocabulary (its tokenizer drops it); it becomes this reserved
# token, a trained-from-scratch slot that keeps spaces apart from unknown characters.
SPACE_TOKEN = "[unused1]"


# Below this share of one-character entries (after removing "##") a vocabulary is word pieces.
MIN_CHAR_SHARE = 0.5


FETCH_FIX = ("run `make lm` for lm/m3e-small (or `make lac` for lm/lac-small), or give a Hugging Face encoder: "
             "its local directory, or its hub name (org/name) once it is in the local Hugging Face cache")


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
