"""A residual Add and the RMSNorm after it as ONNX Runtime's
``com.microsoft.SkipSimplifiedLayerNormalization``: one kernel that adds, normalizes and
also hands the sum on (the residual stream), where a decoder layer ran six nodes twice.

The RMSNorm is matched in the form ``targets/onnx/passes/rsqrt_as_division.py`` leaves it in,
``scale * (x / sqrt(mean(x^2) + eps))``. ONNX Runtime fuses that form alone into its
SimplifiedLayerNormalization while it loads the model, but not with the Add before it; and
the standalone op sits in the default ONNX domain, which the ONNX checker refuses in a
file, so only the contrib op with the Add is written here. onnxscript's own skip-norm rule
needs that standalone op already in the graph, hence this rule. Exact matches only: a
norm computed in float32 around a cast (fp16 builds, Gemma's 1 + weight) keeps its nodes.
"""

from __future__ import annotations


def fuse_skip_rms_norms(model) -> int:
    """Rewrite every matching Add + RMSNorm in ``model`` (an onnx_ir Model) in place;
    return how many."""
    import onnx_ir.passes.common as common_passes
    from onnxscript.rewriter import pattern

    count = pattern.RewriteRuleSet([_rule_class().rule()], commute=True).apply_to_model(model)
    if count:
        # the fused node stands where the norm's last node stood; the sum it hands on
        # may have readers above that (an MoE's residual): order the graph again
        model.graph.sort()
        common_passes.RemoveUnusedNodesPass()(model)
        model.opset_imports.setdefault("com.microsoft", 1)
    return count


def _rule_class():
    from onnxscript.rewriter import _ir_utils, pattern

    class SkipRmsNorm(pattern.RewriteRuleClassBase):
        def __init__(self) -> None:
            # the sum also feeds the next residual Add: it stays an output of the match
            super().__init__("SkipRmsNorm", remove_nodes=False)

        def pattern(self, op, x, skip, scale, two, axes, eps):
            total = op.Add(x, skip)
            mean_square = op.ReduceMean(op.Pow(total, two), axes, _allow_other_attributes=True,
                                        _outputs=["mean_square"])
            normed = op.Div(total, op.Sqrt(op.Add(mean_square, eps)))
            return op.Mul(scale, normed), total

        def check(self, context, x, skip, scale, two, axes, eps, mean_square,
                  **_) -> pattern.MatchResult:
            result = pattern.MatchResult()
            for value in (x, skip):
                if value.shape is None or len(value.shape) != 3:
                    return result.fail("the Add's inputs are not [B, S, D]", value)
            width = x.shape[2]
            if x.shape != skip.shape or not isinstance(width, int):
                return result.fail("the Add broadcasts, or its width is unknown", x)
            if scale.shape is None or list(scale.shape) != [width]:
                return result.fail("the scale is not one value per feature", scale)
            if not _ir_utils.is_singleton_value(two, 2.0, rtol=0.0):
                return result.fail("not a square", two)
            if not _ir_utils.is_singleton_value(axes, lambda a: a in (-1, 2)):
                return result.fail("the mean is not over the last dim", axes)
            keep = mean_square.producer().attributes.get_int("keepdims", 1)
            if keep != 1 or not isinstance(_ir_utils.get_singleton_value(eps), float):
                return result.fail("not keepdims, or epsilon is not one float")
            if x.dtype != scale.dtype or str(x.dtype) not in ("FLOAT", "DataType.FLOAT"):
                return result.fail("not float32 throughout", x)
            return result

        def rewrite(self, op, x, skip, scale, eps, **_):
            normed, _mean, _inv_std, total = op.SkipSimplifiedLayerNormalization(
                x, skip, scale, epsilon=_ir_utils.get_singleton_value(eps), _outputs=4,
                _domain="com.microsoft")
            return normed, total

    return SkipRmsNorm
