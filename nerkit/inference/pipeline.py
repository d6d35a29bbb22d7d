"""The pipeline: a trained model with its config and featuriser, ready to use on torch. It predicts
spans with offsets into the original text and evaluates on a gold corpus (the one evaluation path,
nerkit.inference.predictor's, which an exported model on ONNX Runtime shares), and owns the model
directory (save and load, safetensors + JSON/YAML only, never pickle). Building one from training
data is nerkit.training.build's."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import save as safetensors_bytes

from nerkit.config import Config, config_to_yaml, memory_segment
from nerkit.device import resolve_device
from nerkit.errors import ModelDirError, UserError
from nerkit.features.batch import bucketed_batches, collate, collate_padded
from nerkit.features.featurizer import Example, Featurizer
from nerkit.files import atomic_directory, atomic_write_bytes, atomic_write_text
from nerkit.data.tags import Span
from nerkit.inference.model_dir import (
    CONFIG_FILE,
    FORMAT_VERSION,
    LEXICON_FILE,
    METRICS_FILE,
    ONE_RUN_FIX,
    ModelDir,
    SCORE_TEMPERATURE,
    SPAN_SCORE_MAP,
    SPAN_THRESHOLD,
    VOCAB_FILE,
    WEIGHTS_FILE,
    score_map_json,
    vocab_fingerprint,
    write_meta_file,
)
from nerkit.inference.predictor import (  # noqa: F401 (Evaluation and without_whitespace re-exported)
    Evaluation,
    Predictor,
    read_model_dir,
    without_whitespace,
)
from nerkit.inference.recurrence import DocumentStream, MemoryReader
from nerkit.inference.windows import text_windows
from nerkit.model.tagger import Tagger
from nerkit.version import __version__
from nerkit.weights import load_checked, read_safetensors

log = logging.getLogger(__name__)


class Pipeline(Predictor):
    """A model directory's tagger on torch: `Predictor`'s prediction and evaluation, decoded by the
    `Tagger`, and the directory itself (`save`, `load`)."""

    def __init__(self, config: Config, featurizer: Featurizer, device: str | torch.device = "cpu", lm=None):
        """`lm`: the `nerkit.pretrained.base.CharFeatures` (or nerkit.pretrained.stacked's `Stacked` of
        several) whose features join the embeddings, or None. It is handed over here alone: the
        model gets the module and the featuriser its vocabulary."""
        if lm is not None:
            featurizer = featurizer.with_lm_vocab(lm.vocab)
        super().__init__(config, featurizer)
        self.model = Tagger(config, **featurizer.sizes(), lm=lm)
        self.device = torch.device(device)
        self.model.to(self.device)

    def decode_examples(self, examples: list[Example], batch_size: int, window: int,
                        scores: bool = False, trim: bool = False) -> list:
        """`Predictor.decode_examples` by the Tagger, with batches padded by `collate_padded`, or with
        `trim` by `collate` (then the BiLSTM, with no padding to skip, runs oneDNN's fused LSTM)."""
        decoded: list = [[] for _ in examples]
        self.model.eval()
        with torch.inference_mode():
            for idx in bucketed_batches([len(e) for e in examples], batch_size):
                chosen = [examples[j] for j in idx]
                batch = (collate(chosen) if trim else collate_padded(chosen, batch_size, window)).to(self.device)
                found = self.model.decode(batch, **self.decoding(scores))
                for j, result in zip(idx, found):  # the padding rows' entities are dropped
                    decoded[j] = result
        return decoded

    def window_batches(self, token_lists: list, batch_size: int = 64, window: int | None = None,
                       trim: bool = False):
        """Each batch of the texts' prediction windows (`text_windows`), featurised, in inference mode:
        (pieces, batch), `pieces` the (text index, window start, window end) of each row; batches
        padded by `collate_padded`, or with `trim` by `collate` (as `nerkit eval` reads a corpus).
        What the tools that score beyond the entities (`nerkit calibrate`, `nerkit data select`) run
        the model on."""
        window = self.check_window(window)
        pieces = [(i, a, b) for i, tokens in enumerate(token_lists) for a, b in text_windows(len(tokens), window)]
        examples = [self.featurizer.example(list(token_lists[i][a:b])) for i, a, b in pieces]
        self.model.eval()
        with torch.inference_mode():
            for idx in bucketed_batches([len(e) for e in examples], batch_size):
                chosen = [examples[j] for j in idx]
                batch = collate(chosen) if trim else collate_padded(chosen, batch_size, window)
                yield [pieces[j] for j in idx], batch.to(self.device)

    def decoding(self, scores: bool = False) -> dict:
        """What `Tagger.decode` reads besides the batch: whether to score, and what calibration fitted
        (each head reads what it uses)."""
        return {"scores": scores, "temperature": self.score_temperature, "threshold": self.threshold,
                "score_map": self.span_score_map}

    def decoded_windows(self, token_lists: list, batch_size: int = 64, window: int | None = None):
        """`window_batches` through a head with marginals (`supports_marginals`): (rows, emissions
        (B, T, K), mask, paths)."""
        if not self.head.supports_marginals:
            raise UserError(f"this model's head (model.head: {self.config.model.head}) has no tags and no CRF to "
                            "score them with", fix="use a model trained with model.head: crf")
        for pieces, batch in self.window_batches(token_lists, batch_size, window):
            emissions = self.model.emissions(batch)
            yield [p[:2] for p in pieces], emissions, batch.mask, self.model.head.crf.decode(emissions, batch.mask)

    def decision_log_probabilities(self, token_lists: list, batch_size: int = 64, window: int | None = None):
        """Each batch of the texts' windows: (rows (text index, window start, window end), the
        log-probability of the model's decision in each), at what calibration fitted."""
        decoding = self.decoding()
        del decoding["scores"]
        for pieces, batch in self.window_batches(token_lists, batch_size, window):
            yield pieces, self.model.decision_log_probabilities(batch, **decoding)

    def predict_tokens(self, token_lists: list[list[str]], batch_size: int = 64,
                       window: int | None = None, scores: bool = False, trim: bool = False) -> list[list[Span]]:
        """`Predictor.predict_tokens`; with Transformer-XL memory and no window, a text longer than
        one segment is read segment by segment in bounded memory (nerkit.inference.recurrence), and
        the others in batches as before (one segment, no memory: the same computation)."""
        window = self.check_window(window)
        segment = memory_segment(self.config)
        if not segment or window:
            return super().predict_tokens(token_lists, batch_size, window, scores, trim)
        long = {i for i, tokens in enumerate(token_lists) if len(tokens) > segment}
        spans = super().predict_tokens([[] if i in long else t for i, t in enumerate(token_lists)], batch_size, 0,
                                       scores, trim)
        reader = MemoryReader(self)
        for i in sorted(long):
            if scores:
                from nerkit.inference.recurrence import scored

                reader.keep_emissions(1)
                spans[i] = scored(self, token_lists[i], reader.read(token_lists[i]), reader.kept[0])
                reader.kept = None
            else:
                spans[i] = self.spans_of(token_lists[i], reader.read(token_lists[i]))
        return spans

    def document_stream(self) -> DocumentStream:
        """`Predictor.document_stream`: this pipeline reading consecutive texts as one stream."""
        if not memory_segment(self.config):
            return super().document_stream()  # the error
        return DocumentStream(self)

    # ------------------------------------------------------------------------------ model directory

    def write_static_files(self, directory: Path) -> None:
        """Everything of a model directory but the weights and metrics."""
        lexicon = self.featurizer.lexicon
        self.write_meta(directory)
        atomic_write_text(directory / CONFIG_FILE, config_to_yaml(self.config))
        atomic_write_text(directory / VOCAB_FILE, json.dumps(self.featurizer.to_json(), ensure_ascii=False) + "\n")
        if lexicon is not None:
            lexicon.save(directory / LEXICON_FILE)
        if self.model.lm is not None:  # its config and vocabulary; the weights are in model.safetensors
            from nerkit.pretrained.loading import save_lm

            save_lm(self.model.lm, directory, weights=False)

    def write_meta(self, directory: Path) -> None:
        """nerkit.json: what the directory is (format and nerkit versions, encoder, the lexicon's and
        the vocabulary's checksums) and the longest training sentence, which sets the default
        prediction window; what `nerkit calibrate` fitted, when it did: the scores' temperature, the
        span threshold and score map."""
        lexicon = self.featurizer.lexicon
        meta = {"format_version": FORMAT_VERSION, "nerkit_version": __version__, "encoder": self.config.encoder.name,
                "lexicon_sha256": lexicon.fingerprint if lexicon is not None else None,
                "vocab_sha256": vocab_fingerprint(self.featurizer.to_json()), "train_max_len": self.train_max_len}
        if self.score_temperature != 1.0:
            meta[SCORE_TEMPERATURE] = self.score_temperature
        if self.span_threshold is not None:
            meta[SPAN_THRESHOLD] = self.span_threshold
        if self.span_score_map is not None:
            meta[SPAN_SCORE_MAP] = score_map_json(self.span_score_map)
        write_meta_file(directory, meta)

    def write_weights(self, directory: Path, metrics: dict | None = None) -> None:
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.model.state_dict().items()}
        # Serialised here and written by Python, so that a full disk is an OSError with its errno.
        data = safetensors_bytes(state, metadata={"format_version": str(FORMAT_VERSION)})
        atomic_write_bytes(directory / WEIGHTS_FILE, data)
        if metrics is not None:
            atomic_write_text(directory / METRICS_FILE, json.dumps(metrics, indent=2, ensure_ascii=False) + "\n")

    def save(self, directory: str | Path, metrics: dict | None = None) -> Path:
        """Write a complete model directory atomically (a temporary directory, then one rename)."""
        directory = Path(directory)
        with atomic_directory(directory) as tmp:
            self.write_static_files(tmp)
            self.write_weights(tmp, metrics or {})
        return directory

    @classmethod
    def load(cls, directory: str | Path | ModelDir, device: str = "cpu") -> "Pipeline":
        """The model directory `directory` (a path, or its `ModelDir` already read) on torch."""
        found = read_model_dir(directory)
        directory = found.model_dir.path
        config, vocab, lexicon = found.config, found.vocab, found.lexicon
        lm = None
        if (directory / "lm").is_dir():
            from nerkit.pretrained.loading import load_saved_lm

            lm = load_saved_lm(directory, sources=len(config.embeddings.lm_sources()))
        featurizer = Featurizer.from_json(config, vocab, lexicon, where=str(directory / VOCAB_FILE))
        pipe = cls(config, featurizer, device=resolve_device(device), lm=lm)
        pipe.read_settings(found.model_dir)
        weights = directory / WEIGHTS_FILE
        state = read_safetensors(weights, fix="the file is damaged or not a safetensors file; retrain or copy it again",
                                 error=ModelDirError)
        load_checked(pipe.model, state, "model.safetensors does not match config.yaml and vocab.json", where=str(weights),
                     fix=ONE_RUN_FIX, error=ModelDirError)
        pipe.model.eval()
        return pipe
