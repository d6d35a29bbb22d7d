"""Hugging Face language models as character features: a character-level Chinese encoder (BERT,
RoBERTa-wwm, MacBERT style) read from a local directory, one LM token per character so offsets stay
exact, its vocabulary checked and its weights read from safetensors (or a `pytorch_model.bin` with
weights_only=True). `transformers` is imported only inside the functions that build a model; the
shared module is nerkit.pretrained.base's, and nerkit.pretrained.loading chooses between this and LAC.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from pickle import (
    UnpicklingError,  # the error torch.load(weights_only=True) raises for objects
)

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from nerkit.errors import UserError
from nerkit.pretrained.base import (
    CharFeatures,
    _gist,
    lm_windows,
)
from nerkit.pretrained.vocab import (  # noqa: F401 (LMVocab and its constants re-exported: their home before)
    FETCH_FIX,
    MIN_CHAR_SHARE,
    SPACE_TOKEN,
    SPECIALS,
    LMVocab,
)
from nerkit.weights import load_checked

# A vocab.txt with fewer lines than this share of config.json's vocab_size is taken for a truncated
# copy (vocabularies padded to a round vocab_size stay well above it).
MIN_VOCAB_SHARE = 0.9


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
        if torch.compiler.is_exporting():
            return self._one_window(lm_ids, mask)
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

    def _one_window(self, lm_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """`states` of sentences of at most `window` characters, in operations an ONNX export can
        trace (`nerkit export`, which reads longer texts in prediction windows of this size): each
        sentence is one row, [CLS] characters [SEP] then padding, as `states` builds it."""
        lengths = mask.sum(dim=1, keepdim=True)  # (B, 1)
        positions = torch.arange(lm_ids.size(1) + 2, device=lm_ids.device)[None, :]  # (1, T + 2)
        vocab = self.vocab
        shifted = nn.functional.pad(lm_ids, (1, 1), value=vocab.pad_id)  # (B, T + 2): character i at i + 1
        input_ids = torch.where(positions <= lengths, shifted, vocab.pad_id)  # (B, T + 2)
        input_ids = torch.where(positions == lengths + 1, vocab.sep_id, input_ids)
        input_ids = torch.where(positions == 0, vocab.cls_id, input_ids)
        attention = (positions <= lengths + 1).long()  # (B, T + 2)
        stack = self._run(input_ids, attention)[:, 1:-1]  # (B, T, S, D)
        return torch.where(mask[:, :, None, None], stack, stack.new_zeros(()))  # inert padding

    def _run(self, input_ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """input_ids, attention (R, W) -> layer states (R, W, S, D) float32."""
        grad = self.finetune and torch.is_grad_enabled()
        # An exported graph stays float32 (ONNX Runtime on a CPU has no use for bf16).
        with torch.set_grad_enabled(grad), torch.autocast(input_ids.device.type, dtype=torch.bfloat16,
                                                          enabled=self.bf16 and not torch.compiler.is_exporting()):
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
