"""Reading PaddlePaddle's files without paddle: tensors of a saved model, jieba's LAC-small folder
turned into LAC's torch state dict, and where jieba keeps those files."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import numpy as np
import torch

from nerkit.errors import UserError
from nerkit.pretrained.lac import (
    CHARS_FILE,
    EXPORT_FIX,
    TAGS_FILE,
    LACConfig,
    LACTagger,
    LACVocab,
)

# ------------------------------------------------------------------------------------ Paddle files

def paddle_state(tensors: dict[str, np.ndarray], config: LACConfig) -> dict[str, torch.Tensor]:
    """LACTagger's state dict from the Paddle parameters of `lex_net`, named as Paddle names them:
    word_emb; for layer k, fc_{2k} and gru_{2k} read forwards, fc_{2k+1} and gru_{2k+1} in reverse
    (the order `_bigru_layer` creates them); fc_{2L} the emissions; crfw. Paddle's fc weight is
    (in, out), torch's (out, in). A gru weight, declared (H, 3H), is used by Paddle's kernel as two
    row-major blocks of its memory: the first 2H * H values are W_u|W_r (H, 2H), the rest W_c (H, H)."""
    H = config.hidden_size

    def tensor(name: str) -> torch.Tensor:
        return torch.from_numpy(np.array(tensors[name], dtype=np.float32))

    state = {"encoder.embedding.weight": tensor("word_emb")}
    for k in range(config.num_layers):
        for direction, n in (("forward_gru", 2 * k), ("reverse_gru", 2 * k + 1)):
            prefix = f"encoder.layers.{k}.{direction}."
            flat = tensor(f"gru_{n}.w_0").reshape(-1)  # (3H * H,)
            state[prefix + "project.weight"] = tensor(f"fc_{n}.w_0").T.contiguous()  # (3H, D_in)
            state[prefix + "project.bias"] = tensor(f"fc_{n}.b_0")  # (3H,)
            state[prefix + "update_reset"] = flat[:2 * H * H].reshape(H, 2 * H).clone()  # (H, 2H)
            state[prefix + "candidate"] = flat[2 * H * H:].reshape(H, H).clone()  # (H, H)
            state[prefix + "bias"] = tensor(f"gru_{n}.b_0").reshape(3 * H)  # (3H,)
    last = 2 * config.num_layers
    state["emission.weight"] = tensor(f"fc_{last}.w_0").T.contiguous()  # (K, 2H)
    state["emission.bias"] = tensor(f"fc_{last}.b_0")  # (K,)
    state["crf"] = tensor("crfw")  # (K + 2, K)
    return state


def paddle_shapes(config: LACConfig) -> dict[str, tuple[int, ...]]:
    """The shape of each Paddle parameter of `lex_net` with this config."""
    E, H, K = config.embedding_dim, config.hidden_size, config.num_tags
    shapes = {"word_emb": (config.vocab_size, E)}
    for n in range(2 * config.num_layers):
        shapes[f"fc_{n}.w_0"] = (E if n < 2 else 2 * H, 3 * H)
        shapes[f"fc_{n}.b_0"] = (3 * H,)
        shapes[f"gru_{n}.w_0"] = (H, 3 * H)
        shapes[f"gru_{n}.b_0"] = (1, 3 * H)
    shapes[f"fc_{2 * config.num_layers}.w_0"] = (2 * H, K)
    shapes[f"fc_{2 * config.num_layers}.b_0"] = (K,)
    shapes["crfw"] = (K + 2, K)
    return shapes


def read_jieba_lac(fold: bool = True) -> tuple[LACTagger, LACVocab, list[str]]:
    """LAC-small from the installed jieba's lac_small/ (model_baseline/, word.dic, tag.dic)."""

    folder = jieba_lac_folder()
    embedding_path = folder / "model_baseline" / "word_emb"
    for path in (folder / CHARS_FILE, folder / TAGS_FILE, embedding_path):
        _require(path)
    vocab = LACVocab.read(folder / CHARS_FILE, fold)
    tags = _read_tags(folder / TAGS_FILE)
    embedding = read_paddle_tensor(embedding_path)
    if embedding.ndim != 2:
        raise UserError(f"expected a 2-d embedding table, found shape {embedding.shape}", where=str(embedding_path),
                        fix="reinstall jieba (pip install --force-reinstall jieba)")
    first_gru = folder / "model_baseline" / "gru_0.w_0"
    _require(first_gru)
    rows, dim = embedding.shape
    hidden = read_paddle_tensor(first_gru).shape[0]  # (H, 3H)
    config = LACConfig(vocab_size=rows, embedding_dim=dim, hidden_size=hidden, num_layers=2,  # nets.py's bigru_num
                       num_tags=len(tags), fold=fold)
    tensors = {}
    for name, shape in paddle_shapes(config).items():
        path = folder / "model_baseline" / name
        _require(path)
        tensors[name] = read_paddle_tensor(path)
        if tuple(tensors[name].shape) != shape:
            raise UserError(f"expected a tensor of shape {shape}, found {tuple(tensors[name].shape)}",
                            where=str(path), fix="reinstall jieba (pip install --force-reinstall jieba)")
    if max(vocab.entries.values()) >= rows:
        raise UserError(f"ids reach {max(vocab.entries.values())} but word_emb has {rows} rows",
                        where=str(folder / CHARS_FILE), fix="reinstall jieba (pip install --force-reinstall jieba)")
    tagger = LACTagger(config)
    tagger.load_state_dict(paddle_state(tensors, config))
    return tagger.eval(), vocab, tags




# ---- jieba's LAC character embeddings -----------------------------------------------------------

# Paddle's VarType for the tensor element types: numpy dtype and the bytes of one element.
_PADDLE_FIX = ("the file is damaged or of another layout; reinstall the package it came from "
               "(pip install --force-reinstall jieba)")


_PADDLE_DTYPES = {1: np.dtype("<i2"), 2: np.dtype("<i4"), 3: np.dtype("<i8"), 4: np.dtype("<f2"),
                  5: np.dtype("<f4"), 6: np.dtype("<f8")}


def read_paddle_tensor(path: str | Path) -> np.ndarray:
    """A tensor saved by Paddle's (fluid) `save_persistables`, read without paddle.

    Layout, little-endian: uint32 version (0); uint64 LoD levels, each a uint64 byte count and that
    many bytes of offsets; uint32 tensor version (0); int32 size of a protobuf `TensorDesc`
    (field 1 varint data type, field 2 int64 dims, packed or not); then the elements, row-major.
    """
    path = Path(path)
    where = str(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read the tensor file ({e.strerror or e})", where=where, fix=_PADDLE_FIX) from None
    try:
        (version,) = struct.unpack_from("<I", data, 0)
        (levels,) = struct.unpack_from("<Q", data, 4)
        pos = 12
        for _ in range(levels):
            (size,) = struct.unpack_from("<Q", data, pos)
            pos += 8 + size
        tensor_version, desc_size = struct.unpack_from("<Ii", data, pos)
        pos += 8
    except struct.error:
        raise UserError("too short for a Paddle tensor file", where=where, fix=_PADDLE_FIX) from None
    if version != 0 or tensor_version != 0 or not 0 < desc_size < 4096:
        raise UserError(f"not a Paddle tensor file (versions {version}/{tensor_version}, descriptor {desc_size} bytes)",
                        where=where, fix=_PADDLE_FIX)
    dtype_code, dims = _tensor_desc(data[pos:pos + desc_size], where)
    pos += desc_size
    dtype = _PADDLE_DTYPES.get(dtype_code)
    if dtype is None or not dims:
        raise UserError(f"unsupported Paddle tensor (data type {dtype_code}, dims {dims})", where=where,
                        fix=_PADDLE_FIX)
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(data) - pos != expected:
        raise UserError(f"the tensor {dims} needs {expected:,} bytes of data, the file holds {len(data) - pos:,}",
                        where=where, fix=_PADDLE_FIX)
    return np.frombuffer(data, dtype=dtype, offset=pos).reshape(dims)


def _tensor_desc(desc: bytes, where: str) -> tuple[int, list[int]]:
    def varint(pos: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            if pos >= len(desc):
                raise UserError("damaged tensor descriptor", where=where, fix=_PADDLE_FIX)
            byte = desc[pos]
            value |= (byte & 0x7F) << shift
            pos, shift = pos + 1, shift + 7
            if not byte & 0x80:
                return value, pos

    pos, dtype_code, dims = 0, None, []
    while pos < len(desc):
        key, pos = varint(pos)
        field, wire = key >> 3, key & 7
        if field == 1 and wire == 0:
            dtype_code, pos = varint(pos)
        elif field == 2 and wire == 0:
            dim, pos = varint(pos)
            dims.append(dim)
        elif field == 2 and wire == 2:
            size, pos = varint(pos)
            end = pos + size
            while pos < end:
                dim, pos = varint(pos)
                dims.append(dim)
        else:
            raise UserError(f"unexpected field {field} in the tensor descriptor", where=where, fix=_PADDLE_FIX)
    if dtype_code is None:
        raise UserError("the tensor descriptor names no data type", where=where, fix=_PADDLE_FIX)
    return dtype_code, dims


def jieba_lac_folder() -> Path:
    """The lac_small/ folder of the installed jieba (Baidu's LAC-small model), found without
    importing jieba; whether it holds every file is for the caller to check."""
    spec = importlib.util.find_spec("jieba")
    if spec is None:
        raise UserError("jieba is not installed", fix="pip install jieba")
    locations = list(spec.submodule_search_locations or [])
    return (Path(locations[0]) if locations else Path(spec.origin).parent) / "lac_small"


def jieba_lac_files() -> tuple[Path, Path]:
    """(embedding tensor, character dictionary) of the LAC-small model inside the installed jieba."""
    folder = jieba_lac_folder()
    tensor, dictionary = folder / "model_baseline" / "word_emb", folder / "word.dic"
    for path in (tensor, dictionary):
        if not path.is_file():
            raise UserError("this jieba has no LAC-small model file", where=str(path),
                            fix="install jieba 0.42 or later (pip install --force-reinstall jieba)")
    return tensor, dictionary


def _require(path: Path) -> None:
    if not path.is_file():
        raise UserError("this jieba lacks a file of its LAC-small model", where=str(path),
                        fix="install jieba 0.42 or later (pip install --force-reinstall jieba)")


def _read_tags(path: Path) -> list[str]:
    """tag.dic: `id<TAB>tag` per line, ids 0..K-1."""
    try:
        lines = [line for line in path.read_text(encoding="utf-8").split("\n") if line]
    except (FileNotFoundError, UnicodeDecodeError):
        raise UserError(f"{path.name} is missing or not UTF-8 text", where=str(path), fix=EXPORT_FIX) from None
    pairs = [line.partition("\t") for line in lines]
    if any(not row.isdigit() or not tag for row, _, tag in pairs) or \
            sorted(int(row) for row, _, _ in pairs) != list(range(len(pairs))):
        raise UserError("expected lines `id<TAB>tag` with ids 0, 1, 2, ...", where=str(path), fix=EXPORT_FIX)
    return [tag for _, _, tag in sorted(pairs, key=lambda p: int(p[0]))]
