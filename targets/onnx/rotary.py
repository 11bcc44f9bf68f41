"""Rotary position embeddings as ONNX Runtime's ``RotaryEmbedding`` contrib op.

transformers applies RoPE as ``x * cos + rotate_half(x) * sin`` with
``cos = cos(cat(freqs, freqs))``: twelve ONNX nodes a layer for the query and key
(Slice, Slice, Neg, Concat, Mul, Mul, Add, each twice) where ONNX Runtime has one kernel
each. The rewrite below finds that pattern in the exported model (onnxscript's rewriter,
the one its own ``ort_fusions`` use) and puts ``com.microsoft.RotaryEmbedding`` in its
place. Its tables are this call's own angles: ``cos_cache = cos(freqs)`` as
[T, head/2] rows and ``position_ids = 0..T-1``, so the rewrite needs no maximum position
and holds for any rope scaling that only changes ``freqs``. Only where the match is
exact (one sequence, the halves duplicated, the whole head rotated, no scaling of cos and
sin after the fact); anything else keeps its plain nodes.

onnxscript's own rotary fusion stops at an intermediate op and needs the angles as
``inv_freq @ position_ids`` (a MatMul); torch.export hands them over as a Mul, which
that rule does not match, so this file has its own.
"""

from __future__ import annotations


def fuse_rotary_embeddings(model) -> int:
    """Rewrite every matching rotary embedding in ``model`` (an onnx_ir Model) in place;
    return how many."""
    import onnx_ir.passes.common as common_passes
    from onnxscript.rewriter import pattern

    from onnxscript.rewriter import _basic_rules

    rules = pattern.RewriteRuleSet([_rule_class().rule()], commute=True)
    count = rules.apply_to_model(model)
    if count:
        model.graph.sort()  # new nodes stand where each match ended: readers may be above
        # the angles' Cos/Sin/Range are built once per match: one copy of each stays
        common_passes.CommonSubexpressionEliminationPass()(model)
        common_passes.RemoveUnusedNodesPass()(model)
        # the heads' transposes now meet the attention's own: onnxscript's basic rules
        # (those torch.onnx ran before) cancel the pairs and merge the reshapes between
        _basic_rules.basic_optimization_rules().apply_to_model(model)
        common_passes.RemoveUnusedNodesPass()(model)
        model.opset_imports.setdefault("com.microsoft", 1)
    return count


def _rule_class():
    from onnxscript.rewriter import _ir_utils, pattern

    def one(value, expected) -> bool:
        return _ir_utils.is_singleton_value(value, expected)

    class HalfTableRotary(pattern.RewriteRuleClassBase):
        def __init__(self) -> None:
            # cos and sin feed every layer's query and key: the matched nodes stay until
            # nothing reads them (RemoveUnusedNodesPass)
            super().__init__("HalfTableRotary", remove_nodes=False)

        def pattern(self, op, x, freqs, cos_axes, sin_axes, start1, end1, start2, end2,
                    axis1, axis2, step1, step2):
            angles = op.Concat(freqs, freqs, axis=-1)
            cos = op.Unsqueeze(op.Cos(angles), cos_axes)
            sin = op.Unsqueeze(op.Sin(angles), sin_axes)
            first = op.Slice(x, start1, end1, axis1, step1)
            second = op.Slice(x, start2, end2, axis2, step2)
            rotated = op.Concat(op.Neg(second), first, axis=-1)
            return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))

        def check(self, context, x, freqs, cos_axes, sin_axes, start1, end1, start2, end2,
                  axis1, axis2, step1, step2, **_) -> pattern.MatchResult:
            result = pattern.MatchResult()
            if x.shape is None or len(x.shape) != 4 or not isinstance(x.shape[3], int):
                return result.fail("x is not [B, heads, T, head] with a known head size", x)
            head = x.shape[3]
            half = head // 2
            if (freqs.shape is None or len(freqs.shape) != 3 or freqs.shape[0] != 1
                    or freqs.shape[2] != half):
                return result.fail("the angles are not [1, T, head / 2]", freqs)
            exact = [(cos_axes, 1), (sin_axes, 1), (step1, 1), (step2, 1), (start1, 0),
                     (end1, half), (start2, half)]
            if not all(one(value, expected) for value, expected in exact):
                return result.fail("not the two halves of the head, cos/sin per position")
            if not one(end2, lambda end: end >= head):
                return result.fail("the second half does not run to the head's end")
            if not all(one(axis, lambda a: a in (3, -1)) for axis in (axis1, axis2)):
                return result.fail("the halves are not taken along the head dim")
            return result

        def rewrite(self, op, x, freqs, **_):
            table = op.Constant(value_ints=[-1, x.shape[3] // 2])
            length = op.Squeeze(op.Shape(freqs, start=1, end=2), op.Constant(value_ints=[0]))
            positions = op.Unsqueeze(op.Range(op.Constant(value_int=0), length,
                                              op.Constant(value_int=1)),
                                     op.Constant(value_ints=[0]))
            cos, sin = op.Reshape(op.Cos(freqs), table), op.Reshape(op.Sin(freqs), table)
            rows = _rows_of(x)
            if rows is None:
                return op.RotaryEmbedding(x, positions, cos, sin, interleaved=0,
                                          _domain="com.microsoft")
            # rotate the projection's [1, T, heads * head] rows, then split the heads as
            # before: the transposes around the heads then cancel in ONNX Runtime (the
            # attention takes [1, T, heads * head] rows too)
            flat, heads_shape = rows
            rotated = op.RotaryEmbedding(flat, positions, cos, sin, interleaved=0,
                                         num_heads=x.shape[1], _domain="com.microsoft")
            return op.Transpose(op.Reshape(rotated, heads_shape), perm=[0, 2, 1, 3])

    return HalfTableRotary


def _rows_of(x):
    """(rows [1, T, heads * head], the reshape's shape) when ``x`` is
    ``Transpose(Reshape(rows, [1, T, heads, head]), perm=[0, 2, 1, 3])``, else None."""
    transpose = x.producer()
    if transpose is None or transpose.op_type != "Transpose" or transpose.domain != "":
        return None
    perm = transpose.attributes.get("perm")
    if perm is None or list(perm.value) != [0, 2, 1, 3]:
        return None
    reshape = transpose.inputs[0].producer()
    if reshape is None or reshape.op_type != "Reshape" or reshape.domain != "":
        return None
    rows = reshape.inputs[0]
    heads, head = x.shape[1], x.shape[3]
    if rows.shape is None or len(rows.shape) != 3 or rows.shape[2] != heads * head:
        return None
    return rows, reshape.inputs[1]
