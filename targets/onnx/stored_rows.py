"""New keys/values the attention kernel has already stored stay out of the step's outputs.

packed_attention.py leaves each packed layer's new rows as ``Slice(present, start, start +
T, axes=[2])`` of the in-place present (contrib_ops.expose_in_place_cache): rows that
GroupQueryAttention has already written into the cache input the runtime passed. Returning
them costs ONNX Runtime a Slice and an output buffer each, and the runtime a binding, an
array view and a copy back onto themselves each: a share of every token's time worth
saving on a CPU.

``store_new_rows`` takes such outputs out of the graph, after checking that each is exactly
the rows at the step's positions: ``start`` is element 0 of a 1-D graph input (the
positions) and ``T`` is that input's length. The partition's meta then names them
(``OnnxRuntimeMeta.stored_outputs``), and the executor returns each as a view of its cache
input at those rows (runtime/executors/onnxruntime.py), so the partition's outputs are
what they were; the generator's cache sees the rows already in place and skips the copy
(runtime/generation/cache.py). Anything not proven so keeps its Slice.
"""

from __future__ import annotations

from dataclasses import dataclass

from targets.onnx.contrib_ops import const_ints


@dataclass(frozen=True)
class StoredRows:
    outputs: tuple[int, ...]  # the graph outputs taken out, by their index before
    into: tuple[int, ...]  # for each, the graph input (cache buffer) holding its rows
    positions: int | None  # the graph input whose element 0 is the first row, length T


def store_new_rows(model, in_place: dict[str, str]) -> StoredRows:
    """Remove every graph output of ``model`` (onnx_ir) that is a proven new-rows Slice of
    an in-place present (``in_place``: {present output: its past input}); returns what was
    removed, by graph index."""
    import onnx_ir.passes.common as common_passes

    inputs = list(model.graph.inputs)
    index_of = {id(value): i for i, value in enumerate(inputs)}
    by_name = {value.name: value for value in inputs}
    into_of = {id(out): index_of[id(by_name[in_place[out.name]])]
               for out in model.graph.outputs if out.name in in_place}
    stored, into, positions = [], [], None
    for index, output in enumerate(model.graph.outputs):
        found = _rows_at_positions(output, into_of)
        if found is None or (positions is not None and found[1] is not positions):
            continue  # (one positions input for all, which the executor reads once)
        stored.append(index)
        into.append(found[0])
        positions = found[1]
    if not stored:
        return StoredRows((), (), None)
    kept = [value for i, value in enumerate(model.graph.outputs) if i not in set(stored)]
    model.graph.outputs.clear()
    model.graph.outputs.extend(kept)
    common_passes.RemoveUnusedNodesPass()(model)
    return StoredRows(tuple(stored), tuple(into), index_of[id(positions)])


def _rows_at_positions(output, into_of: dict):
    """(the cache input index, the positions input) when ``output`` is
    ``Slice(present, Reshape(Gather(positions, 0)), that + Shape(rows with T rows), [2])``
    of an in-place ``present``; else None."""
    slice_ = output.producer()
    if slice_ is None or slice_.op_type != "Slice" or slice_.domain != "" \
            or len(slice_.inputs) != 4 or id(slice_.inputs[0]) not in into_of:
        return None
    present, start, end, axes = slice_.inputs
    if const_ints(axes) != [2]:
        return None
    positions = _first_element_of(start)
    if positions is None or positions.shape is None or len(positions.shape) != 1:
        return None
    length = positions.shape[0]
    add = end.producer()
    if add is None or add.op_type != "Add" or add.inputs[0] is not start \
            or not _counts(add.inputs[1], length):
        return None
    shape = output.shape
    if shape is None or len(shape) != 4 or str(shape[2]) != str(length):
        return None
    return into_of[id(present)], positions


def _first_element_of(value):
    """The 1-D graph input ``x`` when ``value`` is ``Reshape(Gather(x, 0, axis=0), [1])``."""
    reshape = value.producer()
    if reshape is None or reshape.op_type != "Reshape" or const_ints(reshape.inputs[1]) != [1]:
        return None
    gather = reshape.inputs[0].producer()
    if gather is None or gather.op_type != "Gather" or gather.attributes.get_int("axis", 0) \
            or const_ints(gather.inputs[1]) != [0]:
        return None
    source = gather.inputs[0]
    return source if source.is_graph_input() else None


def _counts(value, length) -> bool:
    """``value`` is ``Shape(x, start=a, end=a+1)`` where dim ``a`` of x is ``length``."""
    shape = value.producer()
    if shape is None or shape.op_type != "Shape" or shape.inputs[0].shape is None:
        return False
    dims = list(shape.inputs[0].shape)
    begin = shape.attributes.get_int("start", 0)
    end = shape.attributes.get_int("end", len(dims))
    picked = dims[begin:end]
    return len(picked) == 1 and str(picked[0]) == str(length)
