"""A decode step's attention storing the step's new keys and values in the cache itself.

A generating step returns each layer's new key and value rows, and the runtime writes them
into its cache buffers after the step (runtime/generation/cache.py: an index of slots, a
stack of the rows and a copy, each a kernel after a full drain). The decode attention's
joined kernel can store them instead (kernels/decode_attention.py, the store form): the
last of a key/value head's programs runs after every program of that head read its past
rows, and the slot it writes, ``position % slots``, is masked in this step (a full cache's
is not yet filled, a ring's holds the position a window back: exporter/lm/wrapper.py's
mask), so what the step computes does not change.

``store_new_rows`` makes that choice in the decode pass: a ``decode_attention`` becomes
``decode_attention_store`` (an op that says it mutates the past buffers) only where the
result is exactly the cache write's (its past buffers are step inputs nothing else reads,
its new rows are step outputs, the step is one token whose positions input it is given).
``stored_outputs`` then names those outputs for the partition's meta
(``AotiMeta.stored_outputs``), and the runtime leaves them out of what a step hands its
cache (``Program.run_in_place``).
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind

from targets.aoti.kernels import ops
from targets.aoti.passes.decode_patterns import val

_GUARDS = "_guards_fn"
_AUTO_FUNCTIONALIZED = getattr(torch.ops.higher_order, "auto_functionalized", None)
# the ops that store their new rows (passes/attention_o.py joins the first with o)
_STORES = (ops.decode_attention_store, ops.decode_attention_o_store)


def store_new_rows(module: torch.fx.GraphModule) -> int:
    """Each joined ``decode_attention`` of a one-token step (``module``: the unlifted
    step, its placeholders the step's inputs) whose rows can be stored becomes
    ``decode_attention_store`` given the step's positions; returns how many."""
    positions = _step_positions(module)
    if positions is None:
        return 0
    returned = set(_flat(next(n for n in module.graph.nodes if n.op == "output").args))
    stored = 0
    for node in module.graph.nodes:
        if node.op != "call_function" or node.target is not ops.decode_attention \
                or len(node.args) < 9 or node.args[8] is None:
            continue  # only the joined form has the program that may store
        _, past_k, new_k, past_v, new_v = node.args[:5]
        if past_k is past_v or not (_read_only_by(past_k, node) and _read_only_by(past_v, node)
                                    and new_k in returned and new_v in returned):
            continue
        node.target = ops.decode_attention_store
        node.args = (*node.args[:9], positions)
        stored += 1
    return stored


def stored_outputs(program: ExportedProgram) -> tuple[int, ...]:
    """The indices among ``program``'s user outputs of the rows its attention stored
    itself (the same nodes a store form takes as its new rows)."""
    rows = set()
    for node in program.graph.nodes:
        found = _store_rows(node)
        if found is not None:
            rows.update(found)
    if not rows:
        return ()
    output = next(n for n in program.graph.nodes if n.op == "output")
    specs = program.graph_signature.output_specs
    user = [value for value, spec in zip(output.args[0], specs)
            if spec.kind == OutputKind.USER_OUTPUT]
    return tuple(i for i, value in enumerate(user) if value in rows)


def _step_positions(module: torch.fx.GraphModule) -> torch.fx.Node | None:
    found = step_inputs(module)
    return found[1] if found else None


def step_inputs(module: torch.fx.GraphModule) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """The (input ids, positions) inputs of a one-token generating step
    (runtime/generation/layout.py: ``input_ids`` [1, 1] then ``positions`` [1], both
    int64), or None."""
    inputs = [n for n in module.graph.nodes if n.op == "placeholder"]
    if len(inputs) < 3:
        return None
    ids, positions = val(inputs[0]), val(inputs[1])
    if ids is None or positions is None or ids.dtype != torch.int64 \
            or positions.dtype != torch.int64:
        return None
    if tuple(ids.shape) != (1, 1) or tuple(positions.shape) != (1,):
        return None
    return inputs[0], inputs[1]


def _read_only_by(past, node: torch.fx.Node) -> bool:
    """``past`` is a step input (a cache buffer the runtime owns) that only ``node``
    reads: no other reader sees the slot written, and no view of it is a copy."""
    if not (isinstance(past, torch.fx.Node) and past.op == "placeholder"):
        return False
    # export's input guards (an unlifted module's ``_guards_fn``) check shapes only
    return {user for user in past.users if not (user.op == "call_module"
                                                and user.target == _GUARDS)} == {node}


def _store_rows(node: torch.fx.Node) -> tuple | None:
    """(new_k, new_v) of a call of a store form, as captured or as functionalization
    wraps it; else None."""
    if node.op != "call_function":
        return None
    if node.target in _STORES:
        return node.args[2], node.args[4]
    if _AUTO_FUNCTIONALIZED is not None and node.target is _AUTO_FUNCTIONALIZED \
            and node.args and node.args[0] in _STORES:
        return node.kwargs.get("new_k"), node.kwargs.get("new_v")
    return None


def _flat(value) -> list:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flat(item)]
    return [value]
