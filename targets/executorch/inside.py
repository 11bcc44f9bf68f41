"""Looking inside an ExecuTorch partition for bisect: every op's output as ExecuTorch's
runtime computed it, from its ETDump debug buffer.

ExecuTorch's event tracer logs, per instruction, the values a kernel call writes and the
inputs and outputs of a delegate call; a delegate is one instruction, so the values inside an
XNNPACK subgraph never reach the debug buffer. The partition's program is therefore lowered
again as the build lowers it but with one XNNPACK delegate per op match (``lower_per_op``):
same placement, same kernels, and each delegated op's output becomes a delegate output. A
match XNNPACK fuses (a linear and its relu) stays one delegate, named with all its ops.

Only bisect pays for this (one more lowering and one traced run, in a child process:
traced_run.py); builds emit no ETRecord and run no event tracer. ExecuTorch's ETRecord and
Inspector would map the runtime's events to the graph too, but ``executorch.devtools``
imports pandas, which the target does not install: the lowered program is at hand here, and
its execution plan names each instruction's kernel or delegate, which the graph's nodes are
matched to in order.
"""

from __future__ import annotations

import json
import logging
import operator
import tempfile
from pathlib import Path

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from targets.executorch.lower import source_name
from targets.executorch.traced_run import traced_run

log = logging.getLogger(__name__)

# The event tracer aborts its process when its debug buffer runs out (traced_run.py runs it
# in a child): it is sized for every value it logs, at the dims' upper bounds, and a program
# needing more is not traced.
MAX_DEBUG_BUFFER_BYTES = 4 << 30
ALIGNMENT = 64
LISTED = 8  # a subgraph's ops named in a line
XNNPACK = "XNNPACK delegate"
KERNEL = "portable kernel"

_DTYPES = {"FLOAT": torch.float32, "DOUBLE": torch.float64, "HALF": torch.float16,
           "BFLOAT16": torch.bfloat16, "LONG": torch.int64, "INT": torch.int32,
           "SHORT": torch.int16, "CHAR": torch.int8, "BYTE": torch.uint8, "BOOL": torch.bool}


def intermediate_values(program: ExportedProgram, wanted: dict[str, torch.dtype],
                        inputs: list[torch.Tensor], subgraphs: list | None = None
                        ) -> list[tuple[str, str, torch.Tensor]]:
    """(where it ran, node name, value) for each op output of ``program`` named in
    ``wanted``, in the order ExecuTorch ran them. ``where``: "XNNPACK delegate (linear_1,
    relu fused)" or "portable kernel aten::cumsum.out"; with ``subgraphs`` (the built
    program's XNNPACK subgraphs, as node names), a delegated op's also names its own."""
    from targets.executorch.lower import lower_per_op

    manager = lower_per_op(program)
    size = debug_buffer_bytes(manager.exported_program().graph_module)
    if size > MAX_DEBUG_BUFFER_BYTES:
        log.warning("not looking inside: its values would take %d MiB of debug buffer",
                    size >> 20)
        return []
    with tempfile.TemporaryDirectory(prefix="etdump-") as folder:
        logged = _logged_values(*traced_run(manager.buffer, inputs, size, Path(folder)))
    plan = manager.executorch_program.execution_plan[0]
    produced = []
    source = {node.name: node for node in program.graph.nodes}
    for index, (where, names) in _instruction_nodes(plan, manager.exported_program(),
                                                    source).items():
        values = logged.get(index, [])
        outputs = values[len(values) - len(names):] if len(values) >= len(names) else []
        produced += [(where + built_subgraph(name, subgraphs or []) if where.startswith(XNNPACK)
                      else where, name, value)
                     for name, value in zip(names, outputs) if name in wanted]
    # a node ExecuTorch decomposed names each part after it: its value is the last part's
    last = {name: index for index, (_, name, _) in enumerate(produced)}
    return [row for index, row in enumerate(produced) if last[row[1]] == index]


def built_subgraph(name: str, subgraphs: list) -> str:
    """Where the built program runs the node ``name``: the XNNPACK subgraph holding it."""
    for index, ops in enumerate(subgraphs):
        if name in ops:
            listed = ", ".join(ops[:LISTED]) + (f", {len(ops) - LISTED} more" if len(ops) > LISTED
                                                 else "")
            return f", in the built program's XNNPACK subgraph {index} of {len(subgraphs)} " \
                   f"({listed})"
    return ""


def debug_buffer_bytes(module) -> int:
    """What the event tracer logs, with room to spare: each kernel call's outputs, each
    delegate call's inputs and outputs, and the method's outputs, at their planned sizes."""
    total = 0
    for node in module.graph.nodes:
        if node.op == "output":
            logged = _flat(node.args[0])
        elif node.op != "call_function" or node.target is operator.getitem:
            continue
        elif _call_name(node) == "executorch_call_delegate":
            logged = [*_flat(node.args[1:]), node]
        else:
            logged = [node]
        total += sum(_planned_bytes(arg) for arg in logged if isinstance(arg, Node))
    return total + total // 4 + (1 << 20)


def _planned_bytes(node: Node) -> int:
    specs = _flat(node.meta.get("spec"))
    return sum(-(-int(getattr(spec, "allocated_memory", 0) or 0) // ALIGNMENT) * ALIGNMENT
               + ALIGNMENT for spec in specs if spec is not None)


def _instruction_nodes(plan, edge: ExportedProgram, source: dict[str, Node]
                       ) -> dict[int, tuple[str, list[str]]]:
    """Instruction index -> (where it runs, the names in the source program (``source``:
    its nodes by name) of the values it outputs). Kernel and delegate calls are matched to
    the graph's nodes in order: the emitter walks the graph and emits one call per node."""
    module = edge.graph_module
    nodes = [n for n in module.graph.nodes if n.op == "call_function"]
    position, found = 0, {}
    for index, instruction in enumerate(plan.chains[0].instructions):
        kind = type(instruction.instr_args).__name__
        if kind not in ("KernelCall", "DelegateCall"):
            continue
        wanted = "executorch_call_delegate" if kind == "DelegateCall" else _operator_name(
            plan.operators[instruction.instr_args.op_index])
        while position < len(nodes) and _call_name(nodes[position]) != wanted:
            position += 1
        if position == len(nodes):
            log.debug("instruction %d (%s) matches no node; the rest is not compared",
                      index, wanted)
            break
        node = nodes[position]
        position += 1
        if kind == "DelegateCall":
            inner = getattr(module, node.args[0].target).original_module.graph
            ops = list(dict.fromkeys(source_name(n) for n in inner.nodes
                                     if n.op == "call_function"))
            (out,) = [n for n in inner.nodes if n.op == "output"]
            names = [source_name(arg) for arg in _flat(out.args[0])]
            fused = " fused" if len(ops) > 1 else ""
            found[index] = (f"{XNNPACK} ({', '.join(ops)}{fused})", names)
        elif _same_op(wanted, _source_target(node)):  # not a copy ExecuTorch inserted
            found[index] = (f"{KERNEL} {wanted}", _output_names(node, source))
    return found


def _output_names(node: Node, source: dict[str, Node]) -> list[str]:
    """The source program's names of a kernel's outputs: a tuple's are its getitems there."""
    name = source_name(node)
    if not isinstance(node.meta.get("val"), (tuple, list)):
        return [name]
    items = {user.args[1]: user.name for user in getattr(source.get(name), "users", ())
             if user.target is operator.getitem}
    return [items.get(i, "") for i in range(len(node.meta["val"]))]


def _same_op(kernel: str, source_target: str) -> bool:
    """Whether a kernel ("aten::cumsum.out") computes the source node's op
    ("aten.cumsum.default"), as against a layout copy made from it."""
    base = kernel.split(".")[0].split("::")[-1]
    return base in source_target.split(".")


def _call_name(node: Node) -> str:
    target = node.target
    if getattr(target, "__name__", "") == "executorch_call_delegate":
        return "executorch_call_delegate"
    schema = getattr(target, "_schema", None)
    return f"{schema.name}.{schema.overload_name}" if schema is not None else ""


def _operator_name(op) -> str:
    return f"{op.name}.{op.overload}" if op.overload else f"{op.name}.default"


def _source_target(node: Node) -> str:
    target, sources = str(node.target), node.meta.get("from_node")
    while sources:
        target, sources = str(sources[0].target), sources[0].from_node
    return target


def _flat(value) -> list:
    return [v for item in value for v in _flat(item)] if isinstance(value, (tuple, list)) \
        else [value]


def _logged_values(dump: bytes, buffer: bytes) -> dict[int, list[torch.Tensor]]:
    """Instruction index -> the tensors the event tracer logged for it, in log order."""
    logged: dict[int, list[torch.Tensor]] = {}
    buffer = bytearray(buffer)  # writable, for torch.frombuffer, copied once
    for run in _etdump_json(dump).get("run_data", []):
        for event in run.get("events") or []:
            debug = event.get("debug_event")
            if not debug or int(debug.get("chain_index", 0)) != 0:
                continue  # chain index 2**64 - 1 holds the method's outputs
            tensor = (debug.get("debug_entry") or {}).get("tensor")
            if tensor is not None and tensor.get("scalar_type") in _DTYPES:
                logged.setdefault(int(debug.get("instruction_id", 0)), []).append(
                    _read_tensor(tensor, buffer))
    return logged


def _read_tensor(spec: dict, buffer: bytearray) -> torch.Tensor:
    dtype = _DTYPES[spec["scalar_type"]]
    sizes = [int(s) for s in spec.get("sizes", [])]
    count = 1
    for size in sizes:
        count *= size
    flat = torch.frombuffer(buffer, dtype=dtype, count=count,
                            offset=int(spec.get("offset", 0))) if count else \
        torch.empty(0, dtype=dtype)
    return flat.reshape(sizes).clone()


def _etdump_json(dump: bytes) -> dict:
    """The ETDump as flatc's JSON, through ExecuTorch's own schema and flatc. (Its
    ``deserialize_from_etdump_flatcc`` lives in a package whose ``__init__`` imports the
    Inspector and so pandas.)"""
    import importlib.util

    from executorch.exir._serialize._flatbuffer import _flatc_decompile

    (root,) = importlib.util.find_spec("executorch").submodule_search_locations
    schemas = Path(root) / "devtools" / "etdump"
    with tempfile.TemporaryDirectory(prefix="etdump-json-") as folder:
        for name in ("etdump_schema_flatcc.fbs", "scalar_type.fbs"):
            (Path(folder) / name).write_bytes((schemas / name).read_bytes())
        (Path(folder) / "schema.bin").write_bytes(dump)
        _flatc_decompile(folder, str(Path(folder) / "etdump_schema_flatcc.fbs"),
                         str(Path(folder) / "schema.bin"), ["--size-prefixed"])
        return json.loads((Path(folder) / "schema.json").read_text())
