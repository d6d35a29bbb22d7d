"""An exported model directory (`nerkit export`, nerkit.json's `runtime: onnx`) run on ONNX Runtime,
without torch: `OnnxPipeline` has the Pipeline's `predict`, `evaluate` and `predict_and_score` (they are
`Predictor`'s), featurises with the same `Featurizer` and batches with numpy
(nerkit.features.padding); the graph gives tag ids, decoded in it by the constrained Viterbi.

Its threads: ONNX Runtime releases Python's lock while it runs, so with `threads` N > 1 the pipeline
reads N batches at once, each on one thread (its "lanes"), rather than one batch on N threads:
a recurrent layer reads its time steps one after another, which a second thread within one batch
barely shortens, and the Viterbi decode is many small steps (docs/export.md, "Prediction speed").
A server, which wants each request's batch answered soon, loads it with `lanes=False`.

A graph with a language model reads at most the LM's window at once (nerkit.json's
`onnx.max_length`): longer texts go through prediction windows of that size, where the PyTorch
model would run the LM in overlapping windows itself."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nerkit.errors import ModelDirError, UserError
from nerkit.features.featurizer import Example, Featurizer
from nerkit.features.padding import budgeted_batches, collate_arrays
from nerkit.inference.model_dir import CRF_FILE, ONE_RUN_FIX, ONNX_FILE, ONNX_MODEL_FILES, VOCAB_FILE, ModelDir
from nerkit.model.crf_numpy import entity_probabilities, masked_scores
from nerkit.model.decoded import path_entities
from nerkit.model.span_decode import decode_band
from nerkit.inference.predictor import Predictor, read_model_dir

log = logging.getLogger(__name__)

# Characters in one batch (rows x the longest): the MSRA BiLSTM export read its test text fastest
# around here, against batches of 64 rows padded to the shapes PyTorch's caches need (docs/export.md).
# ONNX Runtime keeps nothing per shape with memory patterns off, so batches are padded to their longest only.
BATCH_CHARS = 1024


def _onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise UserError("an exported model runs on ONNX Runtime, which is not installed",
                        fix='install nerkit with its "onnx" extra: `make install`, or pip install -e ".[onnx]"') from None
    return onnxruntime


def session(path: Path, device: str, threads: int):
    """An ONNX Runtime session of the graph: on the CPU, with `threads` intra-op threads, or on a GPU
    through CUDA's provider."""
    ort = _onnxruntime()
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Memory patterns are planned and kept per input shape: with batches of many shapes they held a
    # TENER's peak at 3.4 GB instead of 1.7 GB (docs/export.md), for 1.5% of speed.
    options.enable_mem_pattern = False
    providers = ["CPUExecutionProvider"]
    if device in ("cuda", "auto") and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
    elif device == "cuda":
        raise UserError("--device is cuda but this ONNX Runtime has no CUDA provider",
                        fix="use --device cpu, or install onnxruntime-gpu")
    try:
        return ort.InferenceSession(str(path), options, providers=providers)
    except Exception as e:  # onnxruntime raises its own classes for a damaged or foreign file
        raise ModelDirError(f"{ONNX_FILE} cannot be loaded ({str(e).splitlines()[0][:200]})", where=str(path),
                            fix="export the model again") from None


# The vocabulary (vocab.json's key) that each id input of a graph is looked up in.
ID_VOCABS = {"char_ids": "chars", "bichar_ids": "bichars", "word_ids": "words"}


def graph_sizes(path: Path, session) -> dict[str, int]:
    """The sizes a graph was exported with: its tags (the emissions' last axis) and the rows of the
    table each id input is looked up in (a Gather from a constant; read with `onnx` when installed)."""
    sizes = {"tags": session.get_outputs()[1].shape[-1]}
    try:
        import onnx
    except ImportError:
        return sizes
    graph = onnx.load(str(path), load_external_data=False).graph
    rows = {t.name: t.dims[0] for t in graph.initializer if t.dims}
    for node in graph.node:
        if node.op_type == "Gather" and node.input[1] in ID_VOCABS and node.input[0] in rows:
            sizes[ID_VOCABS[node.input[1]]] = rows[node.input[0]]
    return sizes


def check_graph_sizes(directory: Path, session, vocab: dict) -> None:
    """vocab.json against the graph, by sizes, for an export whose nerkit.json has no `vocab_sha256`
    (one written before it did; `read_model_dir` checks the checksum): what Pipeline.load's shape
    check is to model.safetensors. A vocabulary of other sizes would index past the graph's tables."""
    wrong = [f"{key}: {len(vocab[key])} in vocab.json, {size} in the graph"
             for key, size in graph_sizes(directory / ONNX_FILE, session).items()
             if isinstance(size, int) and vocab.get(key) is not None and len(vocab[key]) != size]
    if wrong:
        raise ModelDirError(f"{ONNX_FILE} does not match config.yaml and vocab.json: {len(wrong)} sizes differ "
                            f"({'; '.join(wrong)})", where=str(directory / ONNX_FILE), fix=ONE_RUN_FIX)


def read_crf_scores(path: Path, tags: list[str]):
    """An export's CRF scores (`CRF_FILE`), masked by the tag scheme (`crf_numpy.masked_scores`)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        found = load_file(str(path))
        scores = masked_scores(tags, found["start_transitions"], found["transitions"], found["end_transitions"])
    except (SafetensorError, KeyError, ValueError, OSError):
        raise ModelDirError(f"{CRF_FILE} is damaged or not this model's CRF", where=str(path),
                            fix="export the model again") from None
    if scores[1].shape != (len(tags), len(tags)):
        raise ModelDirError(f"{CRF_FILE} holds {scores[1].shape[0]} tags' scores, the model has {len(tags)}",
                            where=str(path), fix=ONE_RUN_FIX)
    return scores


class OnnxPipeline(Predictor):
    """A model exported by `nerkit export`: `Predictor`'s prediction and evaluation, decoded by the graph."""

    def __init__(self, config, featurizer: Featurizer, session, max_length: int | None = None, lanes: int = 1):
        super().__init__(config, featurizer)
        self.session = session
        self.inputs = [i.name for i in session.get_inputs()]
        self.max_length = max_length  # the most characters the graph reads at once (None: any)
        self.lanes = lanes  # batches read at once, each on one thread of its own (started as needed)
        self._pool = ThreadPoolExecutor(lanes, thread_name_prefix="nerkit-onnx") if lanes > 1 else None
        self.crf_scores = None  # the CRF's (start, transitions, end), masked: `read_crf_scores`
        self._said_unscored = False

    def check_window(self, window: int | None) -> int:
        """`Predictor.check_window`, within `max_length` when the graph has one (0 and longer
        windows become `max_length`)."""
        window = super().check_window(window)
        if self.max_length and not 0 < window <= self.max_length:
            return self.max_length
        return window

    def decode_examples(self, examples: list[Example], batch_size: int, window: int,
                        scores: bool = False, trim: bool = False) -> list:
        """`Predictor.decode_examples` by the graph: batches of at most `batch_size` rows and
        `BATCH_CHARS` characters, on `lanes` threads at once. Entity scores are computed from the
        graph's emissions in numpy (nerkit.model.crf_numpy); an export without the CRF's scores
        (`CRF_FILE`) gives its entities none. Its batches are trimmed always (`trim` changes nothing)."""
        batches = budgeted_batches([len(e) for e in examples], batch_size, BATCH_CHARS)
        if "tag_ids" not in self.head.export_outputs:  # a band of span scores, decoded in numpy
            return self.decode_spans(examples, batches)
        wanted, scores = scores, scores and self.crf_scores is not None
        if wanted and not scores and not self._said_unscored:
            log.warning(f"{self.directory}: this export has no {CRF_FILE} (it was written before nerkit scored "
                        "entities): its entities come without scores; export the model again for them")
            self._said_unscored = True

        def decode(idx: list[int]):  # (B, T) tag ids for the examples idx, and their entity scores
            arrays = collate_arrays([examples[j] for j in idx])
            feed = {name: arrays[name] for name in self.inputs}
            if not scores:
                return self.session.run(["tag_ids"], feed)[0], None
            tag_ids, emissions = self.session.run(["tag_ids", "emissions"], feed)
            lengths = [len(examples[j]) for j in idx]
            paths = [row[:n].tolist() for row, n in zip(tag_ids, lengths)]
            return tag_ids, entity_probabilities(self.tags, self.crf_scores, emissions, lengths, paths,
                                                 self.score_temperature)

        if self._pool is not None and len(batches) > 1:
            results = self._pool.map(decode, batches)
        else:
            results = map(decode, batches)
        decoded: list = [[] for _ in examples]
        types = self.featurizer.types
        for idx, (rows, probs) in zip(batches, results):
            for k, (j, row) in enumerate(zip(idx, rows)):
                path = row[:len(examples[j])].tolist()
                decoded[j] = path_entities(path, self.tags, types, probs[k] if probs is not None else None)
        return decoded

    def decode_spans(self, examples: list[Example], batches: list[list[int]]) -> list:
        """The span head's spans of each example (start, end, type index, probability): the graph's
        band logits, decoded in numpy as the PyTorch model decodes them (nerkit.model.span_decode)."""
        threshold = self.threshold  # nerkit.json's calibrated one, else span.threshold

        def decode(idx: list[int]):
            arrays = collate_arrays([examples[j] for j in idx])
            band = self.mapped_band(self.session.run(["band"], {name: arrays[name] for name in self.inputs})[0])  # (B, K, T, W)
            return decode_band(band, [len(examples[j]) for j in idx], threshold, flat=False)  # span.flat: stitched_spans

        results = self._pool.map(decode, batches) if self._pool is not None and len(batches) > 1 else map(decode, batches)
        decoded: list = [[] for _ in examples]
        for idx, found in zip(batches, results):
            for j, spans in zip(idx, found):
                decoded[j] = spans
        return decoded

    @classmethod
    def load(cls, directory: str | Path | ModelDir, device: str = "cpu", threads: int = 0,
             lanes: bool = True) -> "OnnxPipeline":
        """The export in `directory`, on `threads` threads (0: the cores nerkit found free when it
        started, or OMP_NUM_THREADS: nerkit/cores.py): as that many lanes of one thread each, or with
        `lanes` False as one session's intra-op threads."""
        from nerkit.cores import runtime_threads

        threads = threads or runtime_threads()
        lane_count = threads if lanes and device != "cuda" else 1
        found = read_model_dir(directory, ONNX_MODEL_FILES)
        directory = found.model_dir.path
        lm_vocab = None
        if (directory / "lm").is_dir():
            from nerkit.pretrained.vocab import LMVocab

            lm_vocab = LMVocab.read(directory / "lm")
        featurizer = Featurizer.from_json(found.config, found.vocab, found.lexicon, where=str(directory / VOCAB_FILE),
                                          lm_vocab=lm_vocab)
        graph = found.model_dir.meta.get("onnx") or {}
        graph_threads = 1 if lane_count > 1 else threads
        graph_session = session(directory / ONNX_FILE, device, graph_threads)
        if found.model_dir.meta.get("vocab_sha256") is None:
            check_graph_sizes(directory, graph_session, found.vocab)
        pipe = cls(found.config, featurizer, graph_session, graph.get("max_length"), lane_count)
        pipe.read_settings(found.model_dir)
        if (directory / CRF_FILE).is_file():
            pipe.crf_scores = read_crf_scores(directory / CRF_FILE, pipe.tags)
        return pipe

