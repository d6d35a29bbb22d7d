"""An exported model directory (`nerkit export`, nerkit.json's `runtime: onnx`) run on ONNX Runtime,
without torch: `OnnxPipeline` has the Pipeline's `predict`, `evaluate` and `evaluation` (they are
`Predictor`'s), featurises with the same `Featurizer` and pads numpy batches by the same rules
(nerkit.features.padding); the graph gives tag ids, decoded in it by the constrained Viterbi.

A graph with a language model reads at most the LM's window at once (nerkit.json's
`onnx.max_length`): longer texts go through prediction windows of that size, where the PyTorch
model would run the LM in overlapping windows itself."""

from __future__ import annotations

import logging
from pathlib import Path

from nerkit.errors import ModelDirError, UserError
from nerkit.features.featurizer import Example, Featurizer
from nerkit.features.padding import bucketed_batches, collate_arrays, padded_examples
from nerkit.inference.model_dir import ONNX_FILE, ONNX_MODEL_FILES
from nerkit.inference.predictor import Predictor, read_model_dir

log = logging.getLogger(__name__)


def _onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise UserError("an exported model runs on ONNX Runtime, which is not installed",
                        fix='install nerkit with its "onnx" extra: `make install`, or pip install -e ".[onnx]"') from None
    return onnxruntime


def session(path: Path, device: str = "cpu", threads: int = 0):
    """An ONNX Runtime session of the graph: on the CPU, with `threads` intra-op threads (0: the cores
    nerkit found free when it started, nerkit/cores.py), or on a GPU through CUDA's provider."""
    from nerkit.cores import default_threads

    ort = _onnxruntime()
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only
    threads = threads or default_threads()
    if threads:
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


class OnnxPipeline(Predictor):
    """A model exported by `nerkit export`: `Predictor`'s prediction and evaluation, decoded by the graph."""

    def __init__(self, config, featurizer: Featurizer, session, max_length: int | None = None):
        super().__init__(config, featurizer)
        self.session = session
        self.inputs = [i.name for i in session.get_inputs()]
        self.max_length = max_length  # the most characters the graph reads at once (None: any)

    def check_window(self, window: int | None) -> int:
        """`Predictor.check_window`, within `max_length` when the graph has one (0 and longer
        windows become `max_length`)."""
        window = super().check_window(window)
        if self.max_length and not 0 < window <= self.max_length:
            return self.max_length
        return window

    def decode_examples(self, examples: list[Example], batch_size: int, window: int) -> list[list[int]]:
        """`Predictor.decode_examples` by the graph, on numpy batches padded as the PyTorch model's are."""
        decoded: list[list[int]] = [[] for _ in examples]
        for idx in bucketed_batches([len(e) for e in examples], batch_size):
            arrays = collate_arrays(*padded_examples([examples[j] for j in idx], batch_size, window))
            tag_ids = self.session.run(["tag_ids"], {name: arrays[name] for name in self.inputs})[0]  # (B, T)
            for j, row in zip(idx, tag_ids):  # the padding rows' paths are dropped
                decoded[j] = row[:len(examples[j])].tolist()
        return decoded

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu", threads: int = 0) -> "OnnxPipeline":
        directory = Path(directory)
        found = read_model_dir(directory, ONNX_MODEL_FILES)
        lm_vocab = None
        if (directory / "lm").is_dir():
            from nerkit.pretrained.vocab import LMVocab

            lm_vocab = LMVocab.read(directory / "lm")
        featurizer = Featurizer.from_json(found.config, found.vocab, found.lexicon, where=str(directory / "vocab.json"),
                                          lm_vocab=lm_vocab)
        graph = found.meta.get("onnx") or {}
        pipe = cls(found.config, featurizer, session(directory / ONNX_FILE, device, threads), graph.get("max_length"))
        pipe.train_max_len = found.train_max_len
        pipe.directory = directory
        return pipe

