"""``int4-weight`` on the cuda target: int4 rows our own decode kernel reads
(int4_triton.py), in place of torchao's tinygemm tiles, which no kernel of ours can read
and whose products left the norms, activations and residuals as kernels of their own.

    before: linear(x, w: float [out, in])
    after:  int4_linear(x, packed: uint8 [out, in/2], scales: [out, in/group, 2], bias)

The format, per row and group of ``group`` weights along ``in`` (128, or 64/32 where
``in`` needs): each weight is ``q * scale + offset`` with ``q`` in 0..15 (asymmetric,
``offset`` the group's minimum); byte ``j`` of a group holds ``q[j]`` in its low nibble and
``q[j + group/2]`` in its high one, so a kernel multiplies a group's bytes by two
contiguous halves of x; each group's (scale, offset) pair sits next to each other in the
weight's float dtype. A product is then ``sum_g scale_g * (q_g . x_g) + offset_g * sum(x_g)``.

``edge_exporter::int4_linear`` is that math in plain torch (its body unpacks and calls a
linear): a prompt's rows run it as Inductor compiles it; a decode step's one-row products
become ``row_gemv`` over the packed rows (passes/decode_kernels.py).
"""

from __future__ import annotations

import functools

import torch

from passes.quantize.quantize_weight_only import INT4_GROUPS
from targets.aoti.kernels import reference
from targets.aoti.kernels.ops import NAMESPACE, TRITON

INT4_LINEAR = f"{NAMESPACE}::int4_linear"
ROWS_ENV = "EDGE_EXPORTER_INT4_ROWS"  # "0": cuda int4-weight builds keep tinygemm
LAYOUT = ("int4 rows: uint8 [out, in/2], byte j of a group holds q[j] and q[j + group/2]; "
          "(scale, offset) per group of 128 (64/32 where in_features needs), "
          "w = q * scale + offset")


def group_of(in_features: int) -> int | None:
    return next((g for g in INT4_GROUPS if in_features % g == 0), None)


def pack(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 [out, in/2], (scale, offset) [out, in/group, 2] in the weight's dtype)
    of a float weight [out, in]; the nibbles are rounded against the stored scale and
    offset, so reference.int4_weight() gives what the kernels compute."""
    rows, cols = weight.shape
    groups = weight.detach().float().reshape(rows, cols // group, group)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = ((high - low) / 15).clamp_min(1e-8).to(weight.dtype).float()
    offset = low.to(weight.dtype).float()
    q = ((groups - offset) / scale).round().clamp(0, 15).to(torch.uint8)
    half = group // 2
    packed = q[..., :half] | (q[..., half:] << 4)
    scales = torch.cat([scale, offset], dim=-1).to(weight.dtype)
    return packed.reshape(rows, cols // 2).contiguous(), scales.contiguous()


def _int4_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    weight = reference.int4_weight(packed, scales).to(x.dtype)
    return torch.nn.functional.linear(x, weight, bias)


def _define() -> None:
    # The body is torch ops only: Inductor compiles it where a triton_op is traced
    # (AOTInductor keeps no Python kernel); a plain custom op where Triton is missing.
    if TRITON:
        torch.library.triton_op(INT4_LINEAR, _int4_linear, mutates_args=())
        return
    op = torch.library.custom_op(INT4_LINEAR, mutates_args=(), schema=torch.library.infer_schema(
        _int4_linear, mutates_args=()))(_int4_linear)
    op.register_fake(lambda x, packed, scales, bias=None: x.new_empty(
        (*x.shape[:-1], packed.shape[0])))


_define()
int4_linear = torch.ops.edge_exporter.int4_linear.default


def swap(module: torch.fx.GraphModule, node: torch.fx.Node, op: str,
         weight_node: torch.fx.Node) -> str | None:
    """A linear's weight as int4 rows (two stored tensors) and the call ``int4_linear``;
    None when done, else why the layer stays float (quantize_weight_only's swap contract)."""
    from passes.graph.rewrite import attribute
    if op != "linear":
        return "int4-weight quantizes linear layers"
    weight = attribute(module, weight_node)
    if weight is None:
        return "its weight is computed in the graph, not a stored tensor"
    if weight.dim() != 2 or not weight.is_floating_point():
        return "its weight is not a 2-D float tensor"
    group = group_of(weight.shape[1])
    if group is None:
        return (f"in_features {weight.shape[1]} is not a multiple of an int4 group "
                f"({', '.join(map(str, INT4_GROUPS))})")
    name = f"{weight_node.target.replace('.', '_')}_int4_rows"
    keep_rows_packed()
    if not hasattr(module, f"{name}_packed"):
        packed, scales = pack(weight, group)
        module.register_buffer(f"{name}_packed", packed)
        module.register_buffer(f"{name}_scales", scales)
    with module.graph.inserting_before(node):
        stored = [module.graph.get_attr(f"{name}_{part}") for part in ("packed", "scales")]
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    node.target = int4_linear
    node.args, node.kwargs = (node.args[0], *stored, bias), {}
    return None


@functools.cache
def keep_rows_packed() -> None:
    """Freezing (a plain build's AOTInductor compile) folds what reads only constants into
    new constants: int4_linear's unpack would be stored as the float weight, 4-8x the
    rows' bytes. Its nibble ops are kept from folding, so the library keeps the rows packed
    and unpacks them as it runs (a generating build does not freeze)."""
    from torch._inductor.constant_folding import add_dont_constant_fold
    aten = torch.ops.aten  # ``>>`` is one or the other after decomposition, by torch version
    for op in (aten.bitwise_and.Scalar, aten.__rshift__.Scalar,
               aten.bitwise_right_shift.Tensor_Scalar):
        add_dont_constant_fold(op)
