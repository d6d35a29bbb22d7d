"""`nerkit export`: a trained model directory as an ONNX model directory that predicts without torch.

The network up to the tag scores (emissions) is traced by torch's ONNX exporter (`torch.onnx.export`,
dynamo), with dynamic batch, length and lattice-word axes; what it cannot trace is written node by node
in nerkit.tools.onnx.graphs and joined to it in the same graph: FLAT's lattice scores (a Scan) and
the CRF's constrained Viterbi decode (two Scans), so the graph gives tag ids. The encoders trace
their export form themselves (`torch.compiler.is_exporting()`: the BiLSTM without packing, sinusoids
computed in the graph, FLAT's scores as one operator, a language model's one window per sentence).

The directory written is a nerkit model directory (config.yaml, vocab.json, lexicon.txt and lm/ as
trained, nerkit.json saying `runtime: onnx`, and model.onnx instead of model.safetensors): `nerkit
predict` and `nerkit eval` run it on ONNX Runtime (nerkit.inference.onnx_runtime). Every graph is
checked with `onnx.checker` and compared with the PyTorch model before the directory is written.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from nerkit.errors import UserError
from nerkit.features.batch import Batch, collate
from nerkit.features.padding import collate_arrays
from nerkit.files import atomic_directory, atomic_write_bytes, atomic_write_text, check_output_directory
from nerkit.inference.model_dir import (
    CONFIG_FILE,
    CRF_FILE,
    EXPORT_FORMATS,
    LEXICON_FILE,
    META_FILE,
    ONNX_FILE,
    QUANTIZE,
    VOCAB_FILE,
    ModelDir,
    _read_json,
    vocab_fingerprint,
)
from nerkit.inference.pipeline import Pipeline
from nerkit.model.span import band_valid
from nerkit.model.tagger import Tagger
from nerkit.tools.onnx.graphs import (
    OPSET,
    fold_weights,
    lattice_score_nodes,
    sort_nodes,
    viterbi_nodes,
)
from nerkit.training.model_card import MODEL_CARD

log = logging.getLogger(__name__)

CHAR_INPUTS = ("char_ids", "bichar_ids", "mask")  # names of nerkit.features.batch.Batch's fields
LATTICE_INPUTS = ("word_ids", "word_heads", "word_tails", "word_mask")


# A float32 graph whose tags differ from the PyTorch model's, or whose emissions differ by more than
# this, is not written: it would be a wrong export, not rounding.
MAX_EMISSION_DIFFERENCE = 1e-3

# An int8 graph is written whatever it changed (rounding is what int8 trades for speed), with a
# warning below this share of verification sentences tagged as the PyTorch model tags them: an LM
# model once kept 82% of them, and found 12.5% fewer entities than float32 on out-of-domain text.
MIN_INT8_SAME_TAGS = 0.95


class EmissionGraph(nn.Module):
    """The tagger up to its emissions, tensors in and out: what torch's exporter traces. The inputs
    are the batch's fields, by their names, so a numpy batch (`collate_arrays`) feeds the graph as it is."""

    def __init__(self, model: Tagger):
        super().__init__()
        self.model = model

    def forward(self, char_ids, bichar_ids, mask, word_ids=None, word_heads=None, word_tails=None,
                word_mask=None, lm_ids=None):
        batch = Batch(char_ids, bichar_ids, mask, word_ids=word_ids, word_heads=word_heads, word_tails=word_tails,
                      word_mask=word_mask, lm_ids=lm_ids)
        return self.model.head.export_forward(self.model.hidden(batch))  # what the head's graph decodes


def graph_outputs(model: Tagger) -> list[str]:
    """What the graph writes (the head's `export_outputs`): the CRF's tag ids and emissions, or the
    span head's band logits."""
    return list(model.head.traits.export_outputs)


def input_names(model: Tagger) -> list[str]:
    return list(CHAR_INPUTS) + (list(LATTICE_INPUTS) if model.uses_lattice else []) + \
        (["lm_ids"] if model.lm is not None else [])


def max_length(pipe: Pipeline) -> int | None:
    """The most characters the graph reads at once (None: any number): a language model's window,
    or the rows of learned positions. Longer texts are read in prediction windows of this size."""
    limits = []
    if pipe.model.lm is not None:
        from nerkit.pretrained.bert import LMEmbedder

        if not isinstance(pipe.model.lm, LMEmbedder):
            raise UserError(f"this model's language model ({type(pipe.model.lm).__name__}) cannot be exported to "
                            "ONNX yet: only a character-level BERT-style one can",
                            fix="export a model without embeddings.lm, or with a BERT-style one")
        limits.append(pipe.model.lm.window)
    options = pipe.config.encoder.options
    if getattr(options, "attention", None) == "learned":
        limits.append(options.max_positions)
    return min(limits) if limits else None


def check_exportable(pipe: Pipeline) -> None:
    options = pipe.config.encoder.options
    if getattr(options, "memory", 0):
        raise UserError(f"encoder.memory = {options.memory}: the Transformer-XL memory reads a text segment by "
                        "segment in Python, which an ONNX graph cannot trace",
                        fix="export a model trained with memory: 0")


def _example_inputs(model: Tagger, names: list[str]) -> dict[str, torch.Tensor]:
    """Inputs to trace with: two sentences of three characters and two lattice words each (sizes of
    0 or 1 would be traced as constants)."""
    batch, length, words = 2, 3, 2
    ids = torch.ones(batch, length, dtype=torch.long)  # <unk>: any id works
    inputs = {"char_ids": ids, "bichar_ids": ids.clone(), "mask": torch.ones(batch, length, dtype=torch.bool),
              "word_ids": torch.ones(batch, words, dtype=torch.long),
              "word_heads": torch.tensor([[0, 1]] * batch), "word_tails": torch.tensor([[1, 2]] * batch),
              "word_mask": torch.ones(batch, words, dtype=torch.bool)}
    if model.lm is not None:
        inputs["lm_ids"] = torch.full((batch, length), model.lm.vocab.unk_id, dtype=torch.long)
    return {name: inputs[name] for name in names}


def _lattice_scores_schema() -> None:
    """FLAT's scores leave torch's exporter as one placeholder node (nerkit.LatticeScores), replaced
    by its Scan afterwards; onnxscript writes a node only for an operator with a schema."""
    import onnx
    from onnx.defs import OpSchema

    if onnx.defs.has("LatticeScores", "nerkit"):
        return
    formal = OpSchema.FormalParameter
    onnx.defs.register_schema(OpSchema(
        "LatticeScores", "nerkit", 1,
        inputs=[formal("moved_q", "T"), formal("rows", "T"), formal("query_rows", "I"), formal("key_rows", "I")],
        outputs=[formal("scores", "T")],
        type_constraints=[("T", ["tensor(float)"], ""), ("I", ["tensor(int64)"], "")]))


def _translations() -> dict:
    import onnxscript

    _lattice_scores_schema()
    nerkit_ops = onnxscript.values.Opset("nerkit", 1)

    def lattice_scores(moved_q, rows, query_rows, key_rows):
        return nerkit_ops.LatticeScores(moved_q, rows, query_rows, key_rows)

    return {torch.ops.nerkit.lattice_scores.default: lattice_scores}


def trace_emissions(pipe: Pipeline, limit: int | None):
    """The emissions graph as an ONNX ModelProto, from torch's dynamo exporter."""
    import nerkit.model.encoders.flat  # noqa: F401 (registers nerkit::lattice_scores)

    model = pipe.model.eval()
    # torch 2.13 leaves a dispatch entry behind after an export (aten.lstm on AutogradCPU -> its
    # decomposition), and the next export in the same process then unrolls the LSTM over the example's
    # three steps, fixing the graph's length at 3. The entries are a cache: clearing them is safe.
    for overload in torch.ops.aten.lstm.overloads():
        getattr(torch.ops.aten.lstm, overload)._dispatch_cache.clear()
    names = input_names(model)
    inputs = _example_inputs(model, names)
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length", max=limit) if limit else torch.export.Dim("length")
    words = torch.export.Dim("words")
    dynamic = {name: {0: batch, 1: words if name in LATTICE_INPUTS else length} for name in names}
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)  # "torchvision is not installed", on every export
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on its own internals
        try:
            program = torch.onnx.export(EmissionGraph(model), (), kwargs=inputs, input_names=names,
                                        output_names=graph_outputs(model)[-1:], dynamic_shapes=dynamic, dynamo=True,
                                        opset_version=OPSET, custom_translation_table=_translations(),
                                        verbose=False)
        finally:
            exporter_log.setLevel(level)
    return program.model_proto


def _lower_lattice_scores(proto) -> None:
    """Each nerkit.LatticeScores placeholder replaced by its Scan (`onnx_graphs.lattice_score_nodes`)."""
    graph = proto.graph
    nodes = list(graph.node)
    del graph.node[:]
    for k, node in enumerate(nodes):
        if node.domain == "nerkit" and node.op_type == "LatticeScores":
            lowered, constants = lattice_score_nodes(*node.input, node.output[0], prefix=f"lattice_scores_{k}/")
            graph.node.extend(lowered)
            graph.initializer.extend(constants)
        else:
            graph.node.append(node)
    kept = [o for o in proto.opset_import if o.domain != "nerkit"]
    del proto.opset_import[:]
    proto.opset_import.extend(kept)


def _add_decode(proto, pipe: Pipeline) -> None:
    """The constrained Viterbi after the emissions; the graph's outputs: tag_ids (B, T) int64, -1 at
    padding, and emissions (B, T, K) float32."""
    from onnx import TensorProto, helper

    start, trans, end = (t.detach().cpu().float().numpy() for t in pipe.model.head.crf._masked_scores(float("-inf")))
    nodes, constants = viterbi_nodes(start, trans, end, "emissions", "mask", "tag_ids")
    graph = proto.graph
    graph.node.extend(nodes)
    graph.initializer.extend(constants)
    del graph.output[:]
    graph.output.extend([
        helper.make_tensor_value_info("tag_ids", TensorProto.INT64, ["batch", "length"]),
        helper.make_tensor_value_info("emissions", TensorProto.FLOAT, ["batch", "length", len(pipe.tags)])])


def build_graph(pipe: Pipeline):
    """The whole graph, text ids in, tag ids out, checked with onnx.checker."""
    import onnx

    check_exportable(pipe)
    proto = trace_emissions(pipe, max_length(pipe))
    # The trace annotates some intermediate values with the example input's length (a fixed 3 where
    # the length is dynamic): runtimes infer shapes themselves, so no annotation is kept to mislead them.
    del proto.graph.value_info[:]
    _lower_lattice_scores(proto)
    if pipe.head.has_tags:  # the graph decodes tags with the CRF's Viterbi; a span band is decoded in numpy, beside it
        _add_decode(proto, pipe)
    proto.producer_name = "nerkit"
    onnx.checker.check_model(proto, full_check=True)
    return proto


def quantize_int8(source: Path, target: Path) -> None:
    """ONNX Runtime's dynamic int8 quantisation of the linear layers (MatMul and Gemm with constant
    weights) and of the LSTMs: weights stored as int8, activations quantised per batch as they come.
    The exporter computes an LSTM's weights from the parameters (PyTorch's gate order sliced into
    ONNX's), so they are folded into initializers first: the quantiser takes only those."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    proto = onnx.load(str(source))
    fold_weights(proto, "LSTM", (1, 2, 3))  # W, R, B
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantiser's advice to pre-process (shape inference, fusions) on the root logger
    try:
        quantize_dynamic(proto, str(target), op_types_to_quantize=["MatMul", "Gemm", "LSTM"],
                         weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)
    proto = onnx.load(str(target))
    sort_nodes(proto.graph)
    onnx.save(proto, str(target))


def verification_texts(pipe: Pipeline, limit: int | None, seed: int = 0) -> list[list[str]]:
    """Sentences of many lengths (1 to 48 characters, several of one length) drawn from the model's own
    characters, to compare the exported graph with the PyTorch model in one batch."""
    rng = np.random.default_rng(seed)
    chars = pipe.featurizer.chars.tokens[2:] or ["字"]
    lengths = [1, 2, 3, 5, 8, 8, 8, 13, 21, 34, 48]
    if limit:
        lengths = [min(n, limit) for n in lengths]
    return [[chars[i] for i in rng.integers(0, len(chars), n)] for n in lengths]


def compare(pipe: Pipeline, session, token_lists: list[list[str]]) -> dict:
    """The graph against the PyTorch model on `token_lists`, all in one batch: the share of sentences
    with identical tags, and the largest emission difference at a real position. The graph runs a
    language model in float32 whatever `embeddings.lm.bf16` says, so the PyTorch model is run so too
    (a bf16 LM's emissions differ from float32's by about 1e-2, which is bf16's rounding, not the
    export's)."""
    examples = [pipe.featurizer.example(tokens) for tokens in token_lists]
    arrays = collate_arrays(examples)
    feeds = {i.name: arrays[i.name] for i in session.get_inputs()}
    if not pipe.head.has_tags:
        return compare_spans(pipe, session.run(["band"], feeds)[0], examples)
    tag_ids, emissions = session.run(["tag_ids", "emissions"], feeds)
    batch = collate(examples)
    sources = pipe.model.lm_sources()
    precisions = [source.bf16 for source in sources]
    try:
        for source in sources:
            source.bf16 = False
        with torch.inference_mode():
            expected_emissions = pipe.model.emissions(batch).float().numpy()
            expected = pipe.model.head.crf.decode(torch.from_numpy(expected_emissions), batch.mask)
    finally:
        for source, bf16 in zip(sources, precisions):
            source.bf16 = bf16
    mask = arrays["mask"]
    same = sum(list(row[:len(e)]) == tags for row, e, tags in zip(tag_ids, examples, expected))
    return {"sentences": len(examples), "same_tags": same / len(examples),
            "max_emission_difference": float(np.abs(emissions - expected_emissions)[mask].max())}


def compare_spans(pipe: Pipeline, band: np.ndarray, examples: list) -> dict:
    """The span head's `compare`: the share of sentences whose spans (offsets, types and
    probabilities within 1e-4) the graph's band gives as the PyTorch model's does, and the largest
    difference of a band logit inside a sentence (under the key the CRF's emissions use)."""
    batch = collate(examples)
    with torch.inference_mode():
        expected_band = pipe.model.head.band(pipe.model.hidden(batch)).float()
    found, expected = (pipe.model.head.decode_band(torch.from_numpy(b), batch.mask) for b in (band, expected_band.numpy()))
    same = sum(len(f) == len(e) and all(a[:3] == b[:3] and abs(a[3] - b[3]) <= 1e-4 for a, b in zip(f, e))
               for f, e in zip(found, expected))
    valid = band_valid(batch.mask, band.shape[-1]).numpy()[:, None].repeat(band.shape[1], 1)  # (B, K, T, W)
    return {"sentences": len(examples), "same_tags": same / len(examples),
            "max_emission_difference": float(np.abs(band - expected_band.numpy())[valid].max())}


def _session(path: Path):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def crf_scores(pipe: Pipeline) -> bytes:
    """The CRF's start, transition and end scores as safetensors: what an export's entity scores are
    computed from, beside the graph's emissions (nerkit.model.crf_numpy)."""
    from safetensors.numpy import save

    crf = pipe.model.head.crf.torch_crf
    return save({name: getattr(crf, name).detach().cpu().float().numpy()
                 for name in ("start_transitions", "transitions", "end_transitions")})


def is_export(directory: Path) -> bool:
    """Whether `directory` is an ONNX export that `nerkit export --force` may replace."""
    try:
        return ModelDir.read(directory).is_export
    except UserError:
        return False


def export_model(model_dir: str | Path, out: str | Path, fmt: str = "onnx", quantize: str | None = None,
                 force: bool = False) -> dict:
    """Export MODEL_DIR to OUT (a nerkit model directory for ONNX Runtime); returns what was written
    and how the graph compares with the PyTorch model. OUT may be replaced only with `force`, and
    only if it is an earlier export."""
    model_dir, out = Path(model_dir), Path(out)
    if fmt not in EXPORT_FORMATS:
        raise UserError(f"unknown export format {fmt!r}", fix=f"use one of {', '.join(EXPORT_FORMATS)}")
    if quantize is not None and quantize not in QUANTIZE:
        raise UserError(f"unknown quantisation {quantize!r}", fix=f"use one of {', '.join(QUANTIZE)}")
    check_output_directory(out, force, own=is_export, inputs=[model_dir], what="an earlier ONNX export")
    source = ModelDir.read(model_dir)
    if source.is_export:
        raise UserError("this model directory is already an ONNX export", where=str(model_dir),
                        fix="export the model directory that `nerkit train` wrote")
    pipe = Pipeline.load(source)
    limit = max_length(pipe)
    proto = build_graph(pipe)
    texts = verification_texts(pipe, limit)
    meta = dict(source.meta)
    with tempfile.TemporaryDirectory() as scratch:
        fp32 = Path(scratch) / "fp32.onnx"
        fp32.write_bytes(proto.SerializeToString())
        found = compare(pipe, _session(fp32), texts)
        if found["same_tags"] < 1 or found["max_emission_difference"] > MAX_EMISSION_DIFFERENCE:
            raise RuntimeError(f"the ONNX graph does not reproduce the PyTorch model: {found}")
        graph_file = fp32
        if quantize == "int8":
            graph_file = Path(scratch) / "int8.onnx"
            quantize_int8(fp32, graph_file)
            import onnx

            onnx.checker.check_model(str(graph_file), full_check=True)
            found = compare(pipe, _session(graph_file), texts)
        # The checksum of the vocab.json copied beside the graph (a directory trained before nerkit.json
        # held it gets it here), so that loading the export refuses another model's vocabulary.
        vocab_sha256 = vocab_fingerprint(_read_json(model_dir / VOCAB_FILE))
        meta.update({"runtime": "onnx", "vocab_sha256": vocab_sha256, "onnx": {
            "opset": OPSET, "quantize": quantize, "max_length": limit,
            "inputs": input_names(pipe.model), "outputs": graph_outputs(pipe.model)}})
        with atomic_directory(out) as tmp:
            for name in (CONFIG_FILE, VOCAB_FILE, LEXICON_FILE, MODEL_CARD):
                if (model_dir / name).is_file():
                    shutil.copyfile(model_dir / name, tmp / name)
            if (model_dir / "lm").is_dir():  # its config and vocabulary (the weights are in the graph)
                shutil.copytree(model_dir / "lm", tmp / "lm", ignore=shutil.ignore_patterns("*.safetensors"))
            shutil.copyfile(graph_file, tmp / ONNX_FILE)
            if pipe.head.supports_marginals:  # what scores its entities on ONNX Runtime
                atomic_write_bytes(tmp / CRF_FILE, crf_scores(pipe))
            atomic_write_text(tmp / META_FILE, json.dumps(meta, indent=2) + "\n")
    size = (out / ONNX_FILE).stat().st_size
    log.info(f"wrote {out / ONNX_FILE} ({size / 2**20:.1f} MiB); against the PyTorch model on {found['sentences']} "
             f"sentences: {100 * found['same_tags']:.0f}% identical tags, emissions within "
             f"{found['max_emission_difference']:.1e}")
    if quantize == "int8" and found["same_tags"] < MIN_INT8_SAME_TAGS:
        log.warning(f"int8 changed the tags of {100 * (1 - found['same_tags']):.0f}% of the verification "
                    f"sentences (below {100 * MIN_INT8_SAME_TAGS:.0f}% identical): score {out} with `nerkit eval` "
                    f"beside {model_dir} before using it, or export without --quantize")
    return {"out": str(out), "bytes": size, "quantize": quantize, "max_length": limit, **found}
