"""ONNX graphs written node by node, for what torch's exporter cannot trace: the CRF's constrained
Viterbi decode (a Scan forward over time, a Scan back over it) and FLAT's lattice scores (a Scan over
the query nodes). `nerkit.tools.onnx.export` adds them to the graph it exports, so that any ONNX runtime
gets tag ids, not scores.

Every piece is batched over sentences of different lengths with the mask, as `nerkit.model.crf.CRF.decode`
is: a padding step keeps each sentence's scores and points back to the same tag, so all rows are
traced back in lockstep.

`fold_weights` and `sort_nodes` are the graph surgery the int8 quantiser needs before and after it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 18  # ReduceMax/ReduceSum take their axes as an input from 18 on

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


def viterbi_nodes(start: np.ndarray, trans: np.ndarray, end: np.ndarray, emissions: str, mask: str,
                  output: str, prefix: str = "viterbi/") -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes that read `emissions` (B, T, K) float32 and `mask` (B, T) bool (left-aligned, every row
    with a real first position) and write `output` (B, T) int64: the best tag path of each row, -1
    at padding. `start` (K,), `trans` (K, K) and `end` (K,) are the CRF's scores with every forbidden
    entry -inf (`CRF._masked_scores`), so no path breaks the tag scheme.

    The first position's scores are `start` plus its emissions; a Scan forward over the other T - 1
    positions (and one padding step, below) keeps the best score ending in each tag and writes one back pointer per step; a Scan
    back over the pointers reads the path. A Scan hands each step its slice, so a step is the five
    operations of the recursion and two Where for padding."""
    b = _Builder(prefix)
    c_trans, c_start = b.constant(np.asarray(trans, np.float32), "trans"), b.constant(np.asarray(start, np.float32), "start")
    c_end = b.constant(np.asarray(end, np.float32), "end")
    c_identity = b.constant(np.arange(len(start), dtype=np.int64)[None, :], "identity")  # (1, K)
    c_zero, c_one = b.constant([0], "zero", np.int64), b.constant([1], "one", np.int64)
    c_axis0, c_axis1, c_axis2 = (b.constant([i], f"axis{i}", np.int64) for i in (0, 1, 2))
    c_int64_max = b.constant([np.iinfo(np.int64).max], "int64_max", np.int64)

    # One padding step is added at the end, so that the forward Scan always has a step to read
    # (onnxruntime refuses a Scan over nothing); it changes no path and is dropped at the end.
    steps = b.op("Transpose", [emissions], perm=[1, 0, 2])  # (T, B, K)
    steps = b.op("Concat", [steps, b.op("Slice", [steps, c_zero, c_one, c_axis0])], "steps", axis=0)  # (T+1, B, K)
    real = b.op("Unsqueeze", [b.op("Transpose", [mask], perm=[1, 0]), c_axis2])  # (T, B, 1)
    real = b.op("Concat", [real, b.op("Not", [b.op("Slice", [real, c_zero, c_one, c_axis0])])], "real",
                axis=0)  # (T+1, B, 1): the first position is real in every row, so the added one is not
    first = b.op("Add", [b.op("Squeeze", [b.op("Slice", [steps, c_zero, c_one, c_axis0]), c_axis0]), c_start],
                 "first")  # (B, K)
    later_steps = b.op("Slice", [steps, c_one, c_int64_max, c_axis0], "later_steps")  # (T, B, K)
    later_real = b.op("Slice", [real, c_one, c_int64_max, c_axis0], "later_real")  # (T, B, 1)

    # Forward: score (B, K) = best path score ending in each tag; one back pointer (B, K) per step.
    body = _Builder(prefix + "forward/")
    score, emitted, is_real = body.name("score"), body.name("emitted"), body.name("is_real")
    candidates = body.op("Add", [body.op("Unsqueeze", [score, c_axis2]), c_trans], "candidates")  # (B, K_prev, K)
    best = body.op("ReduceMax", [candidates, c_axis1], "best", keepdims=0)  # (B, K)
    pointer = body.op("ArgMax", [candidates], "pointer", axis=1, keepdims=0)  # (B, K): the first best, as torch
    next_score = body.op("Where", [is_real, body.op("Add", [best, emitted]), score], "next_score")  # padding keeps it
    back = body.op("Where", [is_real, pointer, c_identity], "back")  # padding points to the same tag
    forward_graph = helper.make_graph(
        body.nodes, "viterbi_forward",
        [_value(score, TensorProto.FLOAT), _value(emitted, TensorProto.FLOAT), _value(is_real, TensorProto.BOOL)],
        [_value(next_score, TensorProto.FLOAT), _value(back, TensorProto.INT64)])
    final, pointers = b.op("Scan", [first, later_steps, later_real], "forward", outputs=2, body=forward_graph,
                           num_scan_inputs=2)  # (B, K), (T, B, K)
    last = b.op("ArgMax", [b.op("Add", [final, c_end])], "last", axis=1, keepdims=0)  # (B,)

    # Backward: the pointers of step t give each tag at t the tag at t - 1; read from the last step
    # to the first, each step writes the tag it starts from at its own position.
    back_body = _Builder(prefix + "backward/")
    tag, step_pointer = back_body.name("tag"), back_body.name("step_pointer")  # (B,), (B, K)
    previous = back_body.op("GatherElements", [step_pointer, back_body.op("Unsqueeze", [tag, c_axis1])], axis=1)
    previous = back_body.op("Squeeze", [previous, c_axis1], "previous")  # (B,)
    tag_out = back_body.op("Identity", [tag], "tag_out")
    backward_graph = helper.make_graph(
        back_body.nodes, "viterbi_backward",
        [_value(tag, TensorProto.INT64), _value(step_pointer, TensorProto.INT64)],
        [_value(previous, TensorProto.INT64), _value(tag_out, TensorProto.INT64)])
    first_tag, later_tags = b.op("Scan", [last, pointers], "backward", outputs=2, body=backward_graph,
                                 num_scan_inputs=1, scan_input_directions=[1],
                                 scan_output_directions=[1])  # (B,), (T, B): the tags of positions 1..T
    tags = b.op("Concat", [b.op("Unsqueeze", [first_tag, c_axis0]), later_tags], axis=0)  # (T+1, B)
    tags = b.op("Slice", [tags, c_zero, b.constant([-1], "minus_one", np.int64), c_axis0], "tags_by_step")  # (T, B)
    tags = b.op("Transpose", [tags], "tags", perm=[1, 0])  # (B, T)
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
    from outside them, which onnxruntime's quantiser overlooks when it reorders a graph (a Scan can
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


def _constant_nodes(name: str, producer: dict, constants: set[str], chain: dict) -> bool:
    """Whether `name` is computed from initializers alone; the nodes that compute it go into `chain`."""
    if name in constants or name in chain:
        return True
    node = producer.get(name)
    if node is None or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return False  # a graph input, or a node with a body (a Loop's or Scan's)
    if not all(_constant_nodes(i, producer, constants, chain) for i in node.input if i):
        return False
    for output in node.output:
        chain[output] = node
    return True


def fold_weights(model: onnx.ModelProto, op_type: str, positions: tuple[int, ...]) -> int:
    """Each input of the `op_type` nodes at `positions` that is computed from initializers alone (the
    exporter's slices, concatenations and reshapes of a parameter) turned into an initializer itself,
    and the nodes then read by nothing dropped. ONNX Runtime's quantiser takes only weights held as
    initializers. The values are computed by onnx's reference runtime, so they are exact. Returns
    how many inputs were folded."""
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    constants = {t.name for t in graph.initializer}
    producer = {output: node for node in graph.node for output in node.output}
    folded = 0
    for node in graph.node:
        for k in positions:
            name = node.input[k] if node.op_type == op_type and k < len(node.input) else ""
            if not name or name in constants:
                continue
            if f"{name}_folded" in constants:  # a weight two nodes share, folded for the first
                node.input[k] = f"{name}_folded"
                continue
            chain: dict = {}
            if not _constant_nodes(name, producer, constants, chain):
                continue
            nodes = [n for n in graph.node if any(o in chain for o in n.output)]  # in the graph's order
            read = {i for n in nodes for i in n.input}
            sub = helper.make_graph(nodes, "fold", [], [helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None)],
                                    [t for t in graph.initializer if t.name in read])
            value = ReferenceEvaluator(helper.make_model(sub, opset_imports=model.opset_import)).run(None, {})[0]
            node.input[k] = f"{name}_folded"  # the nodes that computed it are read by nothing now
            graph.initializer.append(numpy_helper.from_array(np.asarray(value), node.input[k]))
            constants.add(node.input[k])
            folded += 1
    _drop_unread(graph)
    return folded


def _drop_unread(graph: onnx.GraphProto) -> None:
    """The nodes and initializers whose values nothing reads (nor the graph's outputs) removed."""
    while True:
        read = {v.name for v in graph.output}
        for node in graph.node:
            read |= _needs(node)
        kept = [n for n in graph.node if any(o in read for o in n.output)]
        if len(kept) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(kept)
    read |= {v.name for v in graph.input}  # an initializer an older opset also lists as an input stays
    unread = [t for t in graph.initializer if t.name not in read]
    for tensor in unread:
        graph.initializer.remove(tensor)
