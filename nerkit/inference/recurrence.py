"""Reading with Transformer-XL's segment recurrence: a model whose encoder has `encoder.memory`
reads a text longer than one segment a segment at a time, each segment attending to the memory of
the ones before, and its CRF settles tags as they become certain (`nerkit.model.viterbi`). Nothing
held grows with the text's length beyond its own characters and the tag per character that comes
out: no whole-text features, activations or back-pointers.

With `document`, consecutive texts (the lines of an input) are one stream: whole lines are packed
into segments of at most `encoder.segment` characters as document training (`data.context:
document`) packs its sentences (a longer line is cut every `segment` characters), the memory runs
on from line to line, and each line is still decoded as its own tag sequence.

A segment's features are those of its characters within their own line: each piece is featurised
with the one character after it, so a character bigram at a cut is the one the whole line has. A
language model's features (`embeddings.lm`), where a model has one, see one piece at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch

from nerkit.config import memory_segment
from nerkit.data.documents import pack
from nerkit.data.records import DOCUMENT_SEPARATOR
from nerkit.errors import UserError
from nerkit.features.batch import collate
from nerkit.features.featurizer import Example


def pieces(lengths: Iterable[int], segment: int) -> Iterator[list[tuple[int, int, int]]]:
    """The segments of a stream of lines of these lengths: each a list of (line, start, end) pieces
    whose lengths add up to at most `segment`, packed as document training packs its sentences
    (`nerkit.data.documents.pack`), a line longer than a segment cut every `segment` characters."""
    return pack(((list(range(0, length, segment)) or [0], length) for length in lengths), segment)


class MemoryReader:
    """A Pipeline's tagger reading streams with its memory: `read(text)` a text alone, `read_lines`
    consecutive lines as one stream whose memory (`self.memory`) runs on across calls until `reset`."""

    def __init__(self, pipe, margin: int = 0):
        self.pipe = pipe
        self.margin = margin  # `read`: characters after each segment encoded with it, emitted by the next
        self.segment = memory_segment(pipe.config)
        if not self.segment:
            raise ValueError("a MemoryReader needs a model with encoder.memory")
        self.decoder = pipe.model.head.crf.streaming()
        self.memory = None
        self.kept: list[list[np.ndarray]] | None = None  # with `keep_emissions`: each line's emissions, for scores

    def keep_emissions(self, lines: int) -> None:
        """Keep the emissions of the next `lines` lines read (`scored`): what their entities' scores
        are computed from (K numbers a character: the one thing here that grows with the text)."""
        self.kept = [[] for _ in range(lines)]

    def reset(self) -> None:
        self.memory = None

    def read(self, tokens: Sequence[str]) -> list[int]:
        """The tag ids of one text (a string or a token list), read from a fresh memory. With a
        `margin`, each segment is encoded with the `margin` characters after it as a look-ahead that
        it neither emits nor remembers: the next segment reads them again."""
        self.reset()
        if not self.margin:
            return next(iter(self.read_lines([tokens])))
        found: list[int] = []
        self.pipe.model.eval()
        with torch.inference_mode():
            for start in range(0, len(tokens), self.segment):
                end = min(start + self.segment, len(tokens))
                example = self._features(tokens, start, min(end + self.margin, len(tokens)))
                emissions = self._emissions([example], keep=end - start)[: end - start]
                if self.kept is not None:
                    self.kept[0].append(emissions)
                found += self.decoder.push(emissions)
        return found + self.decoder.finish()

    def read_lines(self, lines: Sequence[Sequence[str]]) -> list[list[int]]:
        """The tag ids of each line, the lines read as one stream after whatever this reader read before."""
        found: list[list[int]] = [[] for _ in lines]
        model = self.pipe.model
        model.eval()
        with torch.inference_mode():
            for segment in pieces((len(t) for t in lines), self.segment):
                examples = [self._features(lines[i], a, b) for i, a, b in segment]
                emissions = self._emissions(examples)  # (L, K), L = the pieces' total length
                offset = 0
                for (i, a, b), example in zip(segment, examples):
                    if self.kept is not None:
                        self.kept[i].append(emissions[offset:offset + len(example)])
                    found[i] += self.decoder.push(emissions[offset:offset + len(example)])
                    offset += len(example)
                    if b == len(lines[i]):  # the line ends here: its own tag sequence ends too
                        found[i] += self.decoder.finish()
        return found

    def _features(self, tokens: Sequence[str], start: int, end: int) -> Example:
        """The features of tokens[start:end] as the whole line has them: featurised with the token
        after (for the last bigram), which is then dropped."""
        example = self.pipe.featurizer.example(list(tokens[start:end + 1]))
        if end < len(tokens):
            for name in ("char_ids", "bichar_ids", "lm_ids"):
                if getattr(example, name) is not None:
                    setattr(example, name, getattr(example, name)[: end - start])
        return example

    def _emissions(self, examples: list[Example], keep: int | None = None) -> np.ndarray:
        """The emissions (L, K) of one segment made of these pieces, and the memory moved on past it
        (past its first `keep` positions)."""
        joined = Example([c for e in examples for c in e.char_ids], [c for e in examples for c in e.bichar_ids])
        if examples[0].lm_ids is not None:
            joined.lm_ids = [c for e in examples for c in e.lm_ids]
        batch = collate([joined]).to(self.pipe.device)
        emissions, self.memory = self.pipe.model.read_segment(batch, self.memory, keep)  # (1, L, K)
        return emissions[0].float().cpu().numpy()


def scored(pipe, tokens: Sequence[str], tag_ids: list[int], emissions: list[np.ndarray]) -> list:
    """The spans of a text read with the memory, each scored from its kept `emissions`: the CRF's
    forward-backward (`CRF.entity_probabilities`) over windows of two segments that overlap by one,
    an entity taking its score from the window that holds it most centrally (`scored_spans`), as a
    long text read in prediction windows does. The windows stand in for the whole text, whose
    passes would hold every character's scores at once; an entity a segment or more from a
    window's edge is scored as the whole text would score it, to the precision of the CRF's reach."""
    from nerkit.data.tags import Span, tags_to_spans
    from nerkit.inference.predictor import scored_spans, without_whitespace
    from nerkit.inference.windows import text_windows

    crf, tags = pipe.model.head.crf, pipe.tags
    joined = torch.from_numpy(np.concatenate(emissions)) if emissions else torch.zeros(0, len(tags))  # (n, K)
    windows = []
    for a, b in text_windows(len(tag_ids), 2 * memory_segment(pipe.config)):
        path = tag_ids[a:b]
        mask = torch.ones(1, b - a, dtype=torch.bool)
        probs = crf.entity_probabilities(joined[None, a:b].to(pipe.device), mask.to(pipe.device), [path],
                                         pipe.score_temperature)[0]
        found = tags_to_spans([tags[t] for t in path])
        windows.append((a, b, [Span(s.start, s.end, s.type, p) for s, p in zip(found, probs)]))
    return without_whitespace(list(tokens), scored_spans(tags_to_spans([tags[t] for t in tag_ids]), windows))


class DocumentStream:
    """A Pipeline whose `predict_tokens` reads the texts of every call as the next lines of one
    stream (`nerkit predict --document`, `evaluation(document=True)`); anything else is the pipeline's."""

    def __init__(self, pipe, margin: int = 0):
        self.pipe = pipe
        self.margin = margin  # `read`: characters after each segment encoded with it, emitted by the next
        self.reader = MemoryReader(pipe)

    def __getattr__(self, name: str):
        return getattr(self.pipe, name)

    def reset(self) -> None:
        """The next text starts a new document."""
        self.reader.reset()

    def predict_tokens(self, token_lists: Sequence[Sequence[str]], batch_size: int = 64,
                       window: int | None = None, scores: bool = False) -> list:
        """The spans of each text, read after the texts before it. A text that is a document
        separator (`-DOCSTART-`, as in CoNLL files) has none and starts a new document. With
        `scores`, each line's entities are scored from its emissions (`scored`)."""
        if window:
            raise UserError(f"a document is read as one stream, segment by segment: a window of {window} would cut it",
                            fix="drop --window (or pass --window 0)")
        spans: list = []
        start = 0
        for end in [*(i for i, t in enumerate(token_lists) if _is_separator(t)), len(token_lists)]:
            lines = token_lists[start:end]
            if scores:
                self.reader.keep_emissions(len(lines))
            found = self.reader.read_lines(lines)
            if scores:
                spans += [scored(self.pipe, tokens, tag_ids, kept)
                          for tokens, tag_ids, kept in zip(lines, found, self.reader.kept)]
                self.reader.kept = None
            else:
                spans += [self.pipe.spans_of(tokens, tag_ids) for tokens, tag_ids in zip(lines, found)]
            if end < len(token_lists):
                spans.append([])
                self.reader.reset()
            start = end + 1
        return spans


def _is_separator(tokens: Sequence[str]) -> bool:
    return "".join(tokens) == DOCUMENT_SEPARATOR
