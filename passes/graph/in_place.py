"""Rewriting a program's own graph, with its weights as ``get_attr`` while the rewrite runs.

Rewrites that read or add weights (``attribute``, ``add_constant`` in rewrite.py) are
written against an unlifted module, where weights are ``get_attr`` nodes. Running them on
``program.module()`` and exporting the result again (``rewrite_and_recapture``) costs one
whole ``torch.export`` per pass: on a 300M decoder, a minute each. Here the program's
lifted weights become ``get_attr`` nodes of its own graph module for the rewrite, and
placeholders again after it, with the graph signature and state dict kept in step; the
nodes a rewrite made get their fake values from the program's own fake mode. Nothing is
traced again.

    before: p_w (placeholder, PARAMETER "w") -> linear(x, p_w)
    during: _w (get_attr) -> linear(x, _w)                      the rewrite runs here
    after:  placeholders in signature order: kept weights, new constants as buffers,
            user inputs; unused weights dropped from the signature and the state dict
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch.export import ExportedProgram
from torch.export.graph_signature import (ExportGraphSignature, InputKind, InputSpec,
                                          TensorArgument)

from passes.base import PassResult

_WEIGHTS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
_PREFIX = "_lifted_"


@dataclass
class _Lifted:
    spec: InputSpec
    placeholder: torch.fx.Node  # kept, without users, while the rewrite runs


def rewrite_in_place(program: ExportedProgram, rewrite, figure: str) -> PassResult:
    """Run ``rewrite(module) -> info`` on the program's own graph module, its weights as
    ``get_attr``; ``modified`` is ``bool(info[figure])``, as for a re-capture."""
    graph = program.graph_module.graph
    _signature_names_from_graph(program)
    before, attributes = set(graph.nodes), set(program.graph_module._buffers)
    lifted = _unlift(program)
    try:
        info = rewrite(program.graph_module)
    finally:
        _lift(program, lifted, before)
        for name in set(program.graph_module._buffers) - attributes:  # read by nothing now
            delattr(program.graph_module, name)
    return PassResult(program, modified=bool(info[figure]), info=info)


def _signature_names_from_graph(program: ExportedProgram) -> None:
    """A deep-copied program's placeholders may carry new names (FX renames ``input``, a
    builtin's name, to ``input_1``) while its signature keeps the old: take the graph's."""
    placeholders = [n.name for n in program.graph.nodes if n.op == "placeholder"]
    signature = program.graph_signature
    if len(placeholders) != len(signature.input_specs):
        return
    renamed, specs = {}, []
    for spec, name in zip(signature.input_specs, placeholders):
        if isinstance(spec.arg, TensorArgument) and spec.arg.name != name:
            renamed[spec.arg.name] = name
            spec = dataclasses.replace(spec, arg=TensorArgument(name))
        specs.append(spec)
    if not renamed:
        return
    outputs = [dataclasses.replace(spec, arg=TensorArgument(renamed[spec.arg.name]))
               if isinstance(spec.arg, TensorArgument) and spec.arg.name in renamed else spec
               for spec in signature.output_specs]
    program._graph_signature = ExportGraphSignature(specs, outputs)


def _unlift(program: ExportedProgram) -> dict[str, _Lifted]:
    """Each weight placeholder's readers (not a mutated buffer's) read a get_attr of a
    module attribute instead; the placeholder stays, unused, to take them back."""
    module, graph, signature = program.graph_module, program.graph_module.graph, \
        program.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    specs = {spec.arg.name: spec for spec in signature.input_specs
             if isinstance(spec.arg, TensorArgument)}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    lifted: dict[str, _Lifted] = {}
    for node in placeholders:
        spec = specs.get(node.name)
        if spec is None or spec.kind not in _WEIGHTS or spec.target in mutated:
            continue
        attr = _free_name(module, _PREFIX + node.name)
        module.register_buffer(attr, _value(program, spec.target), persistent=False)
        with graph.inserting_after(placeholders[-1]):
            got = graph.get_attr(attr)
        got.meta = dict(node.meta)
        node.replace_all_uses_with(got)
        lifted[attr] = _Lifted(spec, node)
    return lifted


def _lift(program: ExportedProgram, lifted: dict[str, _Lifted], before: set) -> None:
    """Readers back on the placeholders; the rewrite's new constants as buffers placed
    before the user inputs; weights nothing reads any more out of the signature."""
    module, graph = program.graph_module, program.graph_module.graph
    fake = _fake_mode(graph)
    got_attrs: dict[str, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        if node.op == "get_attr" and (node.target in lifted or node not in before
                                      and _is_tensor_attr(module, node.target)):
            got_attrs.setdefault(node.target, []).append(node)
    dropped, new_specs = [], []
    for attr, record in lifted.items():
        for node in got_attrs.get(attr, []):
            node.replace_all_uses_with(record.placeholder)
            graph.erase_node(node)
        delattr(module, attr)
        if not record.placeholder.users:
            dropped.append(record.spec)
            graph.erase_node(record.placeholder)
    for attr, nodes in got_attrs.items():
        if attr in lifted:
            continue
        value = getattr(module, attr)
        delattr(module, attr)
        target = _free_target(program, attr)
        program.state_dict[target] = value
        with graph.inserting_before(next(iter(graph.nodes))):
            placeholder = graph.placeholder("b_" + target)
        placeholder.meta = {"val": fake.from_tensor(value, static_shapes=True)}
        for node in nodes:
            node.replace_all_uses_with(placeholder)
            graph.erase_node(node)
        new_specs.append(InputSpec(InputKind.BUFFER, TensorArgument(placeholder.name),
                                   target, persistent=True))
    gone = {id(spec) for spec in dropped}
    specs = [spec for spec in program.graph_signature.input_specs if id(spec) not in gone]
    first_user = next((i for i, s in enumerate(specs) if s.kind == InputKind.USER_INPUT),
                      len(specs))
    specs = specs[:first_user] + new_specs + specs[first_user:]
    _drop_state(program, dropped, specs)
    _place_first(graph, [s.arg.name for s in specs])
    _fake_values(graph, before, fake)
    program._graph_signature = ExportGraphSignature(
        specs, _outputs_renamed(graph, program.graph_signature.output_specs))
    graph.lint()
    module.recompile()


def _drop_state(program: ExportedProgram, dropped: list[InputSpec],
                kept: list[InputSpec]) -> None:
    """Unused weights leave the state dict and constants (unless a kept input reads them)."""
    still = {spec.target for spec in kept}
    for spec in dropped:
        if spec.target in still:
            continue
        program.state_dict.pop(spec.target, None)
        program.constants.pop(spec.target, None)


def _place_first(graph: torch.fx.Graph, names: list[str]) -> None:
    """The placeholders at the graph's start, in the signature's order."""
    by_name = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    previous = None
    for name in names:
        node = by_name[name]
        if previous is None:
            first = next(iter(graph.nodes))
            if first is not node:
                first.prepend(node)
        elif previous.next is not node:
            previous.append(node)
        previous = node


# What a node's copied metadata says of the op it was copied from, not of the new node:
# its value, and the source function and module that PT2E quantizers match partitions
# by (a getitem of a merged linear's split, from module q_proj, was taken for a linear)
_OF_THE_OLD_OP = ("val", "tensor_meta", "source_fn_stack", "torch_fn")


def _fake_values(graph: torch.fx.Graph, before: set, fake) -> None:
    """Fake values for the nodes the rewrite made, from their inputs' values."""
    for node in graph.nodes:
        if node in before or node.op != "call_function":
            continue
        for key in _OF_THE_OLD_OP:
            node.meta.pop(key, None)
        stack = node.meta.get("nn_module_stack")
        if stack:  # the calling modules only, not the one whose op it replaced
            node.meta["nn_module_stack"] = dict(list(stack.items())[:-1])
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs),
                                             lambda n: n.meta["val"])
        # the python dispatcher runs the symbolic-shape decompositions export ran under;
        # without it, torch 2.11 refuses a split of a dynamic-length prompt (numel())
        with fake, enable_python_dispatcher():
            node.meta["val"] = node.target(*args, **kwargs)


def _outputs_renamed(graph: torch.fx.Graph, output_specs: list) -> list:
    """Output specs naming what the output node now returns (a removed no-op may have
    been an output)."""
    returned = graph.output_node().args[0]
    specs = []
    for spec, value in zip(output_specs, returned):
        if isinstance(spec.arg, TensorArgument) and isinstance(value, torch.fx.Node) \
                and spec.arg.name != value.name:
            spec = type(spec)(spec.kind, TensorArgument(value.name), spec.target)
        specs.append(spec)
    return specs


def _fake_mode(graph: torch.fx.Graph):
    from torch._guards import detect_fake_mode
    mode = detect_fake_mode([n.meta.get("val") for n in graph.nodes if n.op == "placeholder"])
    if mode is None:
        raise RuntimeError("the program's placeholders carry no fake values")
    return mode


def _value(program: ExportedProgram, target: str) -> torch.Tensor:
    return program.state_dict[target] if target in program.state_dict \
        else program.constants[target]


def _is_tensor_attr(module: torch.nn.Module, name: str) -> bool:
    return "." not in name and isinstance(getattr(module, name, None), torch.Tensor)


def _free_name(module: torch.nn.Module, base: str) -> str:
    name, index = base, 0
    while hasattr(module, name):
        index += 1
        name = f"{base}_{index}"
    return name


def _free_target(program: ExportedProgram, base: str) -> str:
    taken = set(program.state_dict) | set(program.constants)
    name, index = base, 0
    while name in taken:
        index += 1
        name = f"{base}_{index}"
    return name
