"""An average pool whose one window covers the whole input, as the mean it is.

Hugging Face's EfficientNet pools with ``AvgPool2d(1280, ceil_mode=True)`` on a 7x7 map:
XNNPACK refuses ``ceil_mode`` pooling, so ExecuTorch's portable kernel walks the whole
1280x1280 window for each of the 1280 channels, and AOTInductor's pooling loop does the
same: seconds (ExecuTorch) or a quarter second (AOTInductor) per call where the network
itself takes milliseconds. With no padding and no divisor override, a single window that
spans the input averages exactly its H*W values (torch clips the window and its divisor
to the input), so the pool is a ``mean`` over the last two dims, which every backend runs as a plain reduction (XNNPACK included).

    before: avg_pool2d(x, kernel >= (H, W), ..., padding 0)   -> [N, C, 1, 1]
    after:  mean(x, [-2, -1], keepdim=True)
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import rewrite_and_recapture

_POOL = torch.ops.aten.avg_pool2d.default


class GlobalAveragePool:
    name = "global_average_pool"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(program, _rewrite, "pools")


def covers_the_whole_input(node: torch.fx.Node) -> bool:
    """True for an avg_pool2d whose single window spans its input, padding 0, no divisor
    override: the pool is then exactly the mean of each map."""
    if node.target is not _POOL:
        return False
    source, result = node.args[0].meta.get("val"), node.meta.get("val")
    if not isinstance(source, torch.Tensor) or not isinstance(result, torch.Tensor) \
            or not source.dtype.is_floating_point:
        return False
    sizes, out = source.shape[-2:], result.shape[-2:]
    if not all(isinstance(d, int) for d in (*sizes, *out)) or tuple(out) != (1, 1):
        return False
    kernel, padding = _pair(node.args[1]), _pair(_arg(node, 3, "padding", 0))
    return (all(k >= s for k, s in zip(kernel, sizes)) and padding == (0, 0)
            and _arg(node, 6, "divisor_override", None) is None)


def _rewrite(module: torch.fx.GraphModule) -> dict:
    graph, count = module.graph, 0
    for node in list(graph.nodes):
        if not covers_the_whole_input(node):
            continue
        with graph.inserting_after(node):
            mean = graph.call_function(torch.ops.aten.mean.dim, (node.args[0], [-2, -1], True))
        mean.meta.update(node.meta)
        node.replace_all_uses_with(mean)
        graph.erase_node(node)
        count += 1
    graph.lint()
    module.recompile()
    return {"pools": count}


def _arg(node: torch.fx.Node, index: int, name: str, default):
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def _pair(value) -> tuple[int, int]:
    values = [value] if isinstance(value, int) else list(value)
    return (values[0], values[-1])
