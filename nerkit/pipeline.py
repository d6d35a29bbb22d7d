"""The pipeline ties a config, its vocabularies (and lexicon) and a tagger together: it turns raw
text into batches, predicted tags back into spans with offsets into the original text, and owns
the model directory (save and load, safetensors + JSON/YAML only, never pickle)."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Iterable

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from nerkit import __version__
from nerkit.config import Config, build_config, config_to_yaml
from nerkit.corpus import (Sentence, Span, cut_points, detect_scheme, normalize_char, read_corpus, scheme_tags,
                           spans_to_tags, tags_to_spans)
from nerkit.errors import ModelDirError, UserError
from nerkit.evaluate import errors, score
from nerkit.features import Example, Vocab, bigrams, bucketed_batches, collate, load_vectors
from nerkit.files import atomic_directory, atomic_write_bytes, atomic_write_text
from nerkit.model import Tagger

FORMAT_VERSION = 1
MODEL_FILES = ("nerkit.json", "config.yaml", "vocab.json", "model.safetensors")
# Files that could carry pickled code: a model directory holding one is refused outright.
PICKLE_SUFFIXES = (".pkl", ".pickle", ".pt", ".pth", ".bin", ".ckpt", ".joblib", ".npy", ".npz")


def set_threads(threads: int) -> None:
    """torch's intra-op threads for this process; 0 keeps torch's default (one per core). On a busy
    machine fewer threads than cores avoid threads spinning against each other."""
    if threads < 0:
        raise UserError(f"--threads must not be negative, not {threads}", fix="use 0 for torch's default, or N >= 1")
    if threads:
        torch.set_num_threads(threads)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("train.device is cuda but torch sees no GPU", fix="use --set train.device=cpu or auto")
    return torch.device(name)


class Pipeline:
    def __init__(self, config: Config, chars: Vocab, bichars: Vocab, tags: list[str],
                 words: Vocab | None = None, lexicon=None, device: str | torch.device = "cpu"):
        self.config = config
        self.chars, self.bichars, self.tags, self.words, self.lexicon = chars, bichars, tags, words, lexicon
        self.tag_index = {t: i for i, t in enumerate(tags)}
        self.scheme = detect_scheme(tags)
        self.model = Tagger(config, len(chars), len(bichars), tags, len(words) if words else 0)
        self.device = torch.device(device)
        self.model.to(self.device)

    # ------------------------------------------------------------------------------ building

    @classmethod
    def from_training_data(cls, config: Config, sentences: list[Sentence], types: list[str], scheme: str,
                           device="cpu", log=print) -> "Pipeline":
        norm = config.data.normalize
        char_counts: Counter = Counter()
        bichar_counts: Counter = Counter()
        for sent in sentences:
            chars = [normalize_char(c) for c in sent.tokens] if norm else sent.tokens
            char_counts.update(chars)
            bichar_counts.update(bigrams(chars))
        emb = config.embeddings
        chars = Vocab.build(char_counts, emb.min_freq)
        bichars = Vocab.build(bichar_counts, emb.bichar_min_freq) if emb.bichar_dim else Vocab([])
        words, lexicon = None, None
        from nerkit.encoders import ENCODERS

        if getattr(ENCODERS[config.encoder.name], "uses_lattice", False):
            lexicon, words = cls._lexicon_and_words(config, sentences, log)
        pipe = cls(config, chars, bichars, scheme_tags(types, scheme), words, lexicon, device)
        for vectors, vocab, module, dim in ((emb.char_vectors, chars, pipe.model.embedder.chars, emb.char_dim),
                                            (emb.bichar_vectors, bichars, pipe.model.embedder.bichars, emb.bichar_dim),
                                            (emb.word_vectors, words, pipe.model.words, emb.word_dim)):
            if vectors and module is not None:
                table, found = load_vectors(vectors, vocab, dim)
                module.weight.data.copy_(table)
                module.weight.requires_grad_(not emb.freeze)
                log(f"pretrained vectors {vectors}: {found} of {len(vocab) - 2} vocabulary entries found")
        return pipe

    @staticmethod
    def _lexicon_and_words(config: Config, sentences: list[Sentence], log):
        from nerkit.lexicon import Lexicon, build_lattice

        lc = config.lexicon
        lexicon = Lexicon.from_source(lc.source, lc.min_len, lc.max_len or None, lc.min_freq or None)
        counts: Counter = Counter()
        for sent in sentences:
            counts.update(build_lattice(sent.text, lexicon, config.lexicon.max_words, config.lexicon.drop).words)
        words = Vocab.build(counts, 1)
        log(f"lexicon: {len(lexicon)} words; {len(words) - 2} of them occur in the training data")
        return lexicon, words

    # ------------------------------------------------------------------------------ features

    def example(self, tokens: list[str], tags: list[str] | None = None) -> Example:
        chars = [normalize_char(c) for c in tokens] if self.config.data.normalize else tokens
        ex = Example(self.chars.ids(chars), self.bichars.ids(bigrams(chars)) if len(self.bichars) > 2
                     else [0] * len(chars))
        if tags is not None:
            ex.tag_ids = [self.tag_index[t] for t in tags]
        if self.model.uses_lattice:
            from nerkit.lexicon import build_lattice

            lattice = build_lattice("".join(chars), self.lexicon, self.config.lexicon.max_words,
                                    self.config.lexicon.drop)
            ex.word_ids = self.words.ids(lattice.words)
            ex.word_heads, ex.word_tails = lattice.word_heads, lattice.word_tails
        return ex

    def training_examples(self, sentences: list[Sentence]) -> list[Example]:
        return [self.example(s.tokens, spans_to_tags(len(s), s.spans(), self.scheme)) for s in sentences]

    # ------------------------------------------------------------------------------ prediction

    def predict_tokens(self, token_lists: list[list[str]], batch_size: int = 64) -> list[list[Span]]:
        """Spans for each token list; lists longer than `data.max_len` are split into pieces
        (preferably at punctuation) and the pieces' spans shifted back."""
        pieces: list[tuple[int, int, list[str]]] = []  # (sentence index, offset, tokens)
        for i, tokens in enumerate(token_lists):
            if not tokens:
                continue
            starts = cut_points(tokens, self.config.data.max_len)
            for a, b in zip(starts, starts[1:] + [len(tokens)]):
                pieces.append((i, a, tokens[a:b]))
        results: list[list[Span]] = [[] for _ in token_lists]
        examples = [self.example(p[2]) for p in pieces]
        self.model.eval()
        with torch.inference_mode():
            for idx in bucketed_batches([len(e) for e in examples], batch_size):
                batch = collate([examples[i] for i in idx]).to(self.device)
                for i, tag_ids in zip(idx, self.model.decode(batch)):
                    sent, offset, _ = pieces[i]
                    spans = tags_to_spans([self.tags[t] for t in tag_ids])
                    results[sent].extend(Span(s.start + offset, s.end + offset, s.type) for s in spans)
        for spans in results:
            spans.sort(key=lambda s: s.start)
        return results

    def predict(self, texts: Iterable[str], batch_size: int = 64) -> list[list[dict]]:
        """Entities of each text: `{"start", "end", "type", "text"}`, offsets into the text, end exclusive."""
        texts = list(texts)
        spans = self.predict_tokens([list(t) for t in texts], batch_size)
        return [[{"start": s.start, "end": s.end, "type": s.type, "text": t[s.start:s.end]} for s in ss]
                for t, ss in zip(texts, spans)]

    def evaluate(self, path: str | Path, batch_size: int = 128, repair: bool | None = None,
                 with_errors: bool = False) -> dict:
        """Entity-level P/R/F1 of the model on a corpus file (the same path training's dev F1 takes);
        `with_errors` adds `errors`, the per-type breakdown of `nerkit.evaluate.errors`."""
        corpus = read_corpus(path, repair=self.config.data.repair if repair is None else repair)
        metrics, predicted = self.evaluate_sentences(corpus.sentences, batch_size)
        if with_errors:
            metrics["errors"] = errors([s.spans() for s in corpus.sentences], predicted)
        return metrics

    def evaluate_sentences(self, sentences: list[Sentence], batch_size: int = 128) -> tuple[dict, list[list[Span]]]:
        predicted = self.predict_tokens([s.tokens for s in sentences], batch_size)
        return score([s.spans() for s in sentences], predicted), predicted

    # ------------------------------------------------------------------------------ model directory

    def vocab_json(self) -> dict:
        return {"chars": self.chars.tokens, "bichars": self.bichars.tokens, "tags": self.tags,
                "words": self.words.tokens if self.words else None}

    def write_static_files(self, directory: Path) -> None:
        """Everything of a model directory but the weights and metrics."""
        atomic_write_text(directory / "nerkit.json", json.dumps(
            {"format_version": FORMAT_VERSION, "nerkit_version": __version__, "encoder": self.config.encoder.name,
             "lexicon_sha256": self.lexicon.fingerprint if self.lexicon else None}, indent=2) + "\n")
        atomic_write_text(directory / "config.yaml", config_to_yaml(self.config))
        atomic_write_text(directory / "vocab.json", json.dumps(self.vocab_json(), ensure_ascii=False) + "\n")
        if self.lexicon is not None:
            self.lexicon.save(directory / "lexicon.txt")

    def write_weights(self, directory: Path, metrics: dict | None = None) -> None:
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.model.state_dict().items()}
        # Serialised here and written by Python, so that a full disk is an OSError with its errno.
        data = safetensors_bytes(state, metadata={"format_version": str(FORMAT_VERSION)})
        atomic_write_bytes(directory / "model.safetensors", data)
        if metrics is not None:
            atomic_write_text(directory / "metrics.json", json.dumps(metrics, indent=2, ensure_ascii=False) + "\n")

    def save(self, directory: str | Path, metrics: dict | None = None) -> Path:
        """Write a complete model directory atomically (a temporary directory, then one rename)."""
        directory = Path(directory)
        with atomic_directory(directory) as tmp:
            self.write_static_files(tmp)
            self.write_weights(tmp, metrics or {})
        return directory

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> "Pipeline":
        directory = Path(directory)
        check_model_dir(directory)
        meta = _read_json(directory / "nerkit.json")
        if meta.get("format_version") != FORMAT_VERSION:
            raise ModelDirError(
                f"model format version {meta.get('format_version')!r}, but this nerkit reads version {FORMAT_VERSION}",
                where=str(directory / "nerkit.json"), fix="retrain the model with this nerkit version")
        import yaml

        try:
            raw = yaml.safe_load((directory / "config.yaml").read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError):
            raise ModelDirError("config.yaml is not valid YAML", where=str(directory / "config.yaml")) from None
        config = build_config(raw, str(directory / "config.yaml"))
        vocab = _read_json(directory / "vocab.json")
        try:
            chars, bichars, tags = Vocab(vocab["chars"]), Vocab(vocab["bichars"]), list(vocab["tags"])
            words = Vocab(vocab["words"]) if vocab.get("words") is not None else None
        except (KeyError, TypeError):
            raise ModelDirError("vocab.json lacks chars, bichars or tags", where=str(directory / "vocab.json")) from None
        lexicon = None
        if words is not None:
            from nerkit.lexicon import Lexicon

            lexicon = Lexicon.load(directory / "lexicon.txt")
            if meta.get("lexicon_sha256") and lexicon.fingerprint != meta["lexicon_sha256"]:
                raise ModelDirError("lexicon.txt does not match the checksum the model was trained with",
                                    where=str(directory / "lexicon.txt"))
        pipe = cls(config, chars, bichars, tags, words, lexicon, device=resolve_device(device))
        try:
            state = load_file(str(directory / "model.safetensors"), device="cpu")
        except Exception as e:  # safetensors raises its own error types for a broken header
            raise ModelDirError(f"model.safetensors cannot be read ({e})", where=str(directory / "model.safetensors"),
                                fix="the file is damaged or not a safetensors file; retrain or copy it again") from None
        expected = pipe.model.state_dict()
        problems = [k for k in expected if k not in state] + [k for k in state if k not in expected]
        problems += [f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in expected.items()
                     if k in state and state[k].shape != v.shape]
        if problems:
            raise ModelDirError(f"model.safetensors does not match config.yaml and vocab.json: {', '.join(problems[:5])}",
                                where=str(directory / "model.safetensors"), fix="use the files of one training run together")
        pipe.model.load_state_dict(state)
        pipe.model.eval()
        return pipe


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ModelDirError("not valid JSON", where=str(path), fix="the model directory is damaged; retrain") from None


def check_model_dir(directory: Path) -> None:
    if not directory.exists():
        raise ModelDirError("model directory not found", where=str(directory),
                            fix="pass the --out directory of `nerkit train`")
    if not directory.is_dir():
        raise ModelDirError("not a directory", where=str(directory), fix="pass the model directory, not a file in it")
    unsafe = sorted(p.name for p in directory.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if unsafe:
        raise ModelDirError(f"refusing a model directory that holds pickle-capable files: {', '.join(unsafe)}",
                            where=str(directory), fix="nerkit models are safetensors + JSON/YAML; remove those files")
    root = directory.resolve()
    for name in MODEL_FILES + ("lexicon.txt",):  # every file the loader reads
        path = directory / name
        if path.is_symlink() and not path.resolve().is_relative_to(root):
            raise ModelDirError(f"{name} is a link to {path.resolve()}, outside the model directory",
                                where=str(directory), fix="copy the file into the directory instead of linking to it")
    for name in MODEL_FILES:
        if not (directory / name).is_file():
            raise ModelDirError(f"{name} is missing", where=str(directory),
                                fix="this is not a complete nerkit model directory (was training interrupted?)")


def seeded_dev_split(sentences: list[Sentence], fraction: float, seed: int) -> tuple[list[Sentence], list[Sentence]]:
    """Carve a reproducible dev set from training sentences (MSRA has no dev set)."""
    order = list(range(len(sentences)))
    random.Random(seed).shuffle(order)
    n_dev = max(1, round(fraction * len(sentences)))
    dev_idx = set(order[:n_dev])
    train = [s for i, s in enumerate(sentences) if i not in dev_idx]
    dev = [s for i, s in enumerate(sentences) if i in dev_idx]
    return train, dev
