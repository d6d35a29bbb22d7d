"""The disk cache of frozen language-model features: a frozen LM is run once per corpus and its
features read back from disk, keyed by the model and the corpus, safe with several processes."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from nerkit.errors import UserError
from nerkit.files import (
    WRITE_ERRNOS,
    atomic_directory,
    atomic_write_text,
)
from nerkit.log import progress_display
from nerkit.pretrained.base import CharFeatures

CACHE_FORMAT = 2  # 2: an XLNet reads a long text in segments with its memory (1: windows)


# ------------------------------------------------------------------------------------ feature cache

def cached_features(embedder: CharFeatures, token_lists: list[list[str]], cache_dir: str | Path,
                    batch_size: int = 32, progress: bool | None = None) -> list[torch.Tensor]:
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
                 progress: bool | None) -> None:
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
    bar = progress_display("LM features", len(token_lists), "sentence", shown=progress)
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
            bar.update(len(indices))
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
