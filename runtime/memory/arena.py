"""Running inside the build's memory plan: one preallocated arena per device.

The build plans (plan/memory_plan.py: ``plan_arenas``) where each planned tensor lives:
an offset into its device's arena. At load, ``Program`` allocates each arena once; two
kinds of tensor then live there instead of coming from the allocator per call:

* a tensor handed from one partition to a partition on another device: the copy lands
  in the destination device's arena (``copy_into``), where ``.to()`` would allocate;
* every planned intermediate (and hand-off output) of a CPU-fallback partition: its
  graph is rewritten to call each op's ``out=`` overload with a slot of the arena
  (``run_in_arena``), as ExecuTorch runs planned programs. Ops without such an
  overload, and program outputs (the caller keeps them past the next call), stay on
  the allocator.

Shapes may be dynamic: the plan is sized at the dims' upper bounds, and a slot is a
tensor on the arena's storage that the ``out=`` op resizes to the call's shape (always
within its planned bytes, since the inputs were checked against those bounds).
"""

from __future__ import annotations

import functools
from typing import Mapping

import torch

from runtime.errors import ArtifactError
from runtime.format.consistency import check_arena_fits

# keys of manifest.memory_plan["arenas"][device]
ARENA_BYTES, SLOTS = "arena_bytes", "slots"


@functools.lru_cache(maxsize=None)
def out_variant(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The ``out=`` overload of a single-output functional op (``add.Tensor`` ->
    ``add.out``): same arguments, by name and type, plus one ``out`` tensor.

    Written here because torch has no public lookup (ExecuTorch's ``to_out_variant``
    does the same schema match and is not installable on its own)."""
    schema = getattr(op, "_schema", None)
    if schema is None or len(schema.returns) != 1 or schema.is_mutable:
        return None
    if str(schema.returns[0].type) != "Tensor" or schema.returns[0].alias_info is not None:
        return None
    wanted = [(a.name, str(a.type)) for a in schema.arguments]
    packet = op.overloadpacket
    for name in packet.overloads():
        candidate = getattr(packet, name)
        args = candidate._schema.arguments
        outs = [a.name for a in args if a.is_out]
        if outs == ["out"] and [(a.name, str(a.type)) for a in args if not a.is_out] == wanted:
            return candidate
    return None


class Arena:
    """One device's preallocated bytes, carved at the planned offsets."""

    def __init__(self, device: str, plan: Mapping, *, where: str = "manifest.json") -> None:
        self.device = device
        self.nbytes, self.slots = _checked(device, plan, where)
        check_arena_fits(device, self.nbytes, where=where)
        self.storage = torch.empty(self.nbytes, dtype=torch.uint8, device=device)

    def slot(self, key: str, dtype: torch.dtype) -> torch.Tensor:
        """An empty tensor at ``key``'s offset that an ``out=`` op may grow to its bytes."""
        offset, _ = self.slots[key]
        return torch.empty(0, dtype=dtype, device=self.device).set_(
            self.storage.untyped_storage(), offset // dtype.itemsize, (0,), (1,))

    def copy_into(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` copied into ``key``'s place (a transfer between devices)."""
        offset, size = self.slots[key]
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes > size:  # cannot happen within the checked bounds; never write past a slot
            return tensor.to(self.device)
        view = self.storage[offset:offset + nbytes].view(tensor.dtype).view(tensor.shape)
        return view.copy_(tensor)


MAX_ARENA_BYTES = 1 << 40
_ALIGNMENT = 64  # what the planner aligns to; a slot's offset must divide by any item size


def _checked(device: str, plan: object, where: str) -> tuple[int, dict[str, tuple[int, int]]]:
    """The plan's size and slots, each slot inside the arena and aligned; else the
    manifest is malformed (ArtifactError), before a byte is allocated."""
    def bad(what: str) -> ArtifactError:
        return ArtifactError(f"the memory plan's {device} arena is malformed: {what}",
                             where=where, hint="rebuild the artifact with `exporter build`")
    if device not in ("cpu", "cuda") or not isinstance(plan, Mapping):
        raise bad("not an object for a known device")
    nbytes, slots = plan.get(ARENA_BYTES), plan.get(SLOTS)
    if type(nbytes) is not int or not 0 <= nbytes <= MAX_ARENA_BYTES or not isinstance(slots,
                                                                                      Mapping):
        raise bad(f"arena_bytes {nbytes!r:.30} or its slots")
    checked = {}
    for key, record in slots.items():
        if not (isinstance(record, list) and len(record) >= 2
                and all(type(v) is int and v >= 0 for v in record[:2])):
            raise bad(f"slot {key!r:.60} is not [offset, size, ...]")
        offset, size = record[:2]
        if offset % _ALIGNMENT or offset + size > nbytes:
            raise bad(f"slot {key!r:.60} at {offset}+{size} is unaligned or outside the arena")
        checked[key] = (offset, size)
    return nbytes, checked


def run_in_arena(gm: torch.fx.GraphModule, arena: Arena, prefix: str) -> list[torch.Tensor]:
    """Rewrite ``gm`` so each node planned under ``<prefix><node name>`` writes into its
    arena slot through the op's ``out=`` overload. Returns the slots (dynamic shapes:
    reset them to empty before each call, so a new shape is no resize warning)."""
    slots = []
    for node in list(gm.graph.nodes):
        key = prefix + node.name
        variant = out_variant(node.target) if node.op == "call_function" else None
        value = node.meta.get("val")
        if key not in arena.slots or variant is None or not isinstance(value, torch.Tensor):
            continue
        slot = arena.slot(key, value.dtype)
        attr = f"_arena_slot_{len(slots)}"
        gm.register_buffer(attr, slot, persistent=False)
        slots.append(slot)
        with gm.graph.inserting_before(node):
            out = gm.graph.get_attr(attr)
            replacement = gm.graph.call_function(variant, node.args, {**node.kwargs, "out": out})
        replacement.meta = dict(node.meta)
        node.replace_all_uses_with(replacement)
        gm.graph.erase_node(node)
    gm.recompile()
    return slots
