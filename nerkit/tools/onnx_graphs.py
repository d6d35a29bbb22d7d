"""ONNX graphs written node by node, for what torch's exporter cannot trace: the CRF's constrained
Viterbi decode (a Loop forward over time, a Loop back over it) and FLAT's lattice scores (a Scan over
the query nodes). `nerkit.tools.export` adds them to the graph it exports, so that any ONNX runtime
gets tag ids, not scores.

Every piece is batched over sentences of different lengths with the mask, as `nerkit.model.crf.CRF.decode`
is: a padding step keeps each sentence's scores and points back to the same tag, so all rows are
traced back in lockstep.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 18  # ReduceMax/ReduceSum take their axes as an input from 18 on

INT64_MIN = np.iinfo(np.int64).min


class _Builder:
    """Nodes and constants of one graph, each name prefixed so that they never meet the host graph's."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{self.prefix}{hint}_{self._count}"

    def constant(self, value, hint: str = "const", dtype=None) -> str:
        name = self.name(hint)
        self.constants.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], hint: str | None = None, outputs: int = 1, **attrs) -> str | list[str]:
        names = [self.name(hint or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=self.name(op_type), **attrs))
        return names[0] if outputs == 1 else names


def _value(name: str, elem_type: int, shape: list | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)  # None: the shape is left to the runtime


def _scalar(name: str, elem_type: int) -> onnx.ValueInfoProto:
    """A Loop body's iteration number or condition: a scalar, as the runtime requires."""
    return helper.make_tensor_value_info(name, elem_type, [])


def viterbi_nodes(start: np.ndarray, trans: np.ndarray, end: np.ndarray, emissions: str, mask: str,
                  output: str, prefix: str = "viterbi/") -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes that read `emissions` (B, T, K) float32 and `mask` (B, T) bool (left-aligned, every row
    with a real first position) and write `output` (B, T) int64: the best tag path of each row, -1
    at padding. `start` (K,), `trans` (K, K) and `end` (K,) are the CRF's scores with every forbidden
    entry -inf (`CRF._masked_scores`), so no path breaks the tag scheme.

    The forward Loop runs T steps from a score of zeros: its first step moves through a matrix whose
    every row is `start`, so no step is special-cased and a one-token batch is a Loop of one."""
    b = _Builder(prefix)
    num_tags = len(start)
    first = np.tile(np.asarray(start, dtype=np.float32)[None, :], (num_tags, 1))  # (K, K): row i = start
    c_first, c_trans = b.constant(first, "first"), b.constant(np.asarray(trans, np.float32), "trans")
    c_end = b.constant(np.asarray(end, np.float32), "end")
    c_identity = b.constant(np.arange(num_tags, dtype=np.int64)[None, :], "identity")  # (1, K)
    c_zero, c_one = b.constant(0, "zero", np.int64), b.constant(1, "one", np.int64)
    c_axis1, c_axis2 = b.constant([1], "axis1", np.int64), b.constant([2], "axis2", np.int64)
    c_true = b.constant(True, "true", np.bool_)

    steps = b.op("Transpose", [emissions], "steps", perm=[1, 0, 2])  # (T, B, K)
    step_mask = b.op("Transpose", [mask], "step_mask", perm=[1, 0])  # (T, B)
    shape = b.op("Shape", [emissions])
    length = b.op("Gather", [shape, c_one], "length", axis=0)  # T, a scalar
    rows_tags = b.op("Gather", [shape, b.constant([0, 2], "bk", np.int64)], axis=0)  # [B, K]
    zeros = b.op("ConstantOfShape", [rows_tags], "zeros", value=numpy_helper.from_array(np.zeros(1, np.float32)))

    # Forward: score (B, K) = best path score ending in each tag; one back pointer (B, K) per step.
    body = _Builder(prefix + "forward/")
    t, keep, score = body.name("t"), body.name("keep"), body.name("score")
    emitted = body.op("Gather", [steps, t], "emitted", axis=0)  # (B, K)
    real = body.op("Gather", [step_mask, t], "real", axis=0)  # (B,)
    is_first = body.op("Equal", [t, c_zero], "is_first")
    moves = body.op("Where", [is_first, c_first, c_trans], "moves")  # (K, K)
    candidates = body.op("Add", [body.op("Unsqueeze", [score, c_axis2]), moves], "candidates")  # (B, K_prev, K)
    best = body.op("ReduceMax", [candidates, c_axis1], "best", keepdims=0)  # (B, K)
    pointer = body.op("ArgMax", [candidates], "pointer", axis=1, keepdims=0)  # (B, K): the first best, as torch
    real = body.op("Unsqueeze", [body.op("Or", [real, is_first]), c_axis1], "real_column")  # (B, 1)
    next_score = body.op("Where", [real, body.op("Add", [best, emitted]), score], "next_score")  # padding keeps it
    back = body.op("Where", [real, pointer, c_identity], "back")  # padding points to the same tag
    keep_out = body.op("Identity", [keep], "keep_out")
    forward_graph = helper.make_graph(
        body.nodes, "viterbi_forward",
        [_scalar(t, TensorProto.INT64), _scalar(keep, TensorProto.BOOL), _value(score, TensorProto.FLOAT)],
        [_scalar(keep_out, TensorProto.BOOL), _value(next_score, TensorProto.FLOAT), _value(back, TensorProto.INT64)])
    final, pointers = b.op("Loop", [length, c_true, zeros], "forward", outputs=2, body=forward_graph)  # (B, K), (T, B, K)
    last = b.op("ArgMax", [b.op("Add", [final, c_end])], "last", axis=1, keepdims=0)  # (B,)

    # Backward: from the last tag, each step's pointer gives the tag before; out come the tags T-1..0.
    back_body = _Builder(prefix + "backward/")
    k, keep, tag = back_body.name("k"), back_body.name("keep"), back_body.name("tag")
    step = back_body.op("Sub", [b.op("Sub", [length, c_one], "last_step"), k], "step")  # T - 1 - k
    pointer = back_body.op("Gather", [pointers, step], "pointer", axis=0)  # (B, K)
    previous = back_body.op("GatherElements", [pointer, back_body.op("Unsqueeze", [tag, c_axis1])], axis=1)  # (B, 1)
    previous = back_body.op("Squeeze", [previous, c_axis1], "previous")  # (B,)
    tag_out = back_body.op("Identity", [tag], "tag_out")
    keep_out = back_body.op("Identity", [keep], "keep_out")
    backward_graph = helper.make_graph(
        back_body.nodes, "viterbi_backward",
        [_scalar(k, TensorProto.INT64), _scalar(keep, TensorProto.BOOL), _value(tag, TensorProto.INT64)],
        [_scalar(keep_out, TensorProto.BOOL), _value(previous, TensorProto.INT64), _value(tag_out, TensorProto.INT64)])
    _, reversed_tags = b.op("Loop", [length, c_true, last], "backward", outputs=2, body=backward_graph)  # (T, B)
    in_order = b.op("Slice", [reversed_tags, b.constant([-1], "minus_one", np.int64),
                              b.constant([INT64_MIN], "int64_min", np.int64), b.constant([0], "axis0", np.int64),
                              b.constant([-1], "step_back", np.int64)], "in_order")  # (T, B)
    tags = b.op("Transpose", [in_order], "tags", perm=[1, 0])  # (B, T)
    b.nodes.append(helper.make_node("Where", [mask, tags, b.constant(-1, "padding", np.int64)], [output],
                                    name=b.name("Where")))
    return b.nodes, b.constants


def viterbi_model(start: np.ndarray, trans: np.ndarray, end: np.ndarray) -> onnx.ModelProto:
    """The decode alone, as a model of its own: emissions (B, T, K) float32 and mask (B, T) bool in,
    tag_ids (B, T) int64 out (-1 at padding)."""
    nodes, constants = viterbi_nodes(start, trans, end, "emissions", "mask", "tag_ids")
    graph = helper.make_graph(
        nodes, "viterbi",
        [helper.make_tensor_value_info("emissions", TensorProto.FLOAT, ["batch", "length", len(start)]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", "length"])],
        [helper.make_tensor_value_info("tag_ids", TensorProto.INT64, ["batch", "length"])],
        initializer=constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def lattice_score_nodes(moved_q: str, rows: str, query_rows: str, key_rows: str, output: str,
                        prefix: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """`nerkit.model.encoders.flat.lattice_scores` as a Scan over the query nodes i: each step builds
    R_i (B, L, M) = ReLU(sum_k rows[k, query_rows[k, b, i] - key_rows[k, b, j]]) for its row alone and
    scores it against moved_q[:, i] (B, H, M), so memory stays that of one row of pairs. moved_q
    (B, L, H, M), rows (K, R, M), query_rows and key_rows (K, B, L) int64 -> output (B, H, L, L)."""
    b = _Builder(prefix)
    c_zero, c_one = b.constant(0, "zero", np.int64), b.constant(1, "one", np.int64)
    c_axis0, c_axis2 = b.constant([0], "axis0", np.int64), b.constant([2], "axis2", np.int64)
    shape = b.op("Shape", [rows])  # [K, R, M]
    count = b.op("Gather", [shape, c_zero], "count", axis=0)
    width = b.op("Gather", [shape, c_one], "width", axis=0)
    # The K tables stacked as one (K R, M); table k's rows start at k R.
    flat_rows = b.op("Reshape", [rows, b.op("Concat", [b.constant([-1], "minus_one", np.int64),
                                                      b.op("Slice", [shape, b.constant([2], "two", np.int64),
                                                                     b.constant([3], "three", np.int64)])], axis=0)])
    offsets = b.op("Mul", [b.op("Range", [c_zero, count, c_one]), width], "offsets")  # (K,)
    offsets = b.op("Reshape", [offsets, b.constant([-1, 1, 1], "column", np.int64)])  # (K, 1, 1)
    keys = b.op("Sub", [key_rows, offsets], "keys")  # (K, B, L)
    queries = b.op("Transpose", [moved_q], "queries", perm=[1, 0, 2, 3])  # (L, B, H, M)
    query_steps = b.op("Transpose", [query_rows], "query_steps", perm=[2, 0, 1])  # (L, K, B)

    body = _Builder(prefix + "row/")
    query, query_row = body.name("query"), body.name("query_row")  # (B, H, M), (K, B)
    index = body.op("Sub", [body.op("Unsqueeze", [query_row, c_axis2]), keys], "index")  # (K, B, L)
    gathered = body.op("Gather", [flat_rows, index], "gathered", axis=0)  # (K, B, L, M)
    relative = body.op("Relu", [body.op("ReduceSum", [gathered, c_axis0], keepdims=0)], "relative")  # (B, L, M)
    scores = body.op("MatMul", [query, body.op("Transpose", [relative], perm=[0, 2, 1])], "scores")  # (B, H, L)
    row_graph = helper.make_graph(
        body.nodes, "lattice_row",
        [_value(query, TensorProto.FLOAT), _value(query_row, TensorProto.INT64)],
        [_value(scores, TensorProto.FLOAT)])
    by_row = b.op("Scan", [queries, query_steps], "by_row", body=row_graph, num_scan_inputs=2)  # (L, B, H, L)
    b.nodes.append(helper.make_node("Transpose", [by_row], [output], name=b.name("Transpose"), perm=[1, 2, 0, 3]))
    return b.nodes, b.constants


def _outer_names(graph: onnx.GraphProto) -> set[str]:
    """The names a subgraph reads from the scopes around it (what it uses and does not define)."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(_needs(node))
        defined.update(node.output)
    return used - defined


def _needs(node: onnx.NodeProto) -> set[str]:
    """A node's inputs, and what its subgraphs (a Loop's or Scan's body) read from outside them."""
    needs = {name for name in node.input if name}
    for attribute in node.attribute:
        for graph in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)):
            needs |= _outer_names(graph)
    return needs


def sort_nodes(graph: onnx.GraphProto) -> None:
    """Order the nodes so that each comes after whatever it reads, including what its subgraphs read
    from outside them, which onnxruntime's quantiser overlooks when it reorders a graph (a Loop can
    end up before the node whose output its body uses). Ties keep the present order."""
    available = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    pending = list(graph.node)
    needs = [_needs(node) for node in pending]
    ordered: list[onnx.NodeProto] = []
    while pending:
        ready = next((i for i, node in enumerate(pending) if needs[i] <= available), None)
        if ready is None:  # a name nothing produces (or a cycle): leave the rest as it is, for the checker to name
            ordered.extend(pending)
            break
        node = pending.pop(ready)
        needs.pop(ready)
        ordered.append(node)
        available.update(node.output)
    del graph.node[:]
    graph.node.extend(ordered)
