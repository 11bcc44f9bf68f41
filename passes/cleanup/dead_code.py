"""Remove nodes whose results nothing uses.

Outputs a caller drops (an unused pooler, say) leave their computation behind
in the captured graph; later passes and quantizers trip on such dangling nodes.

    before: a = linear(x); b = relu(a); unused = tanh(a); return (b,)
    after:  a = linear(x); b = relu(a); return (b,)
"""

from __future__ import annotations

from torch.export import ExportedProgram

from passes.base import PassResult


class EliminateDeadCode:
    name = "eliminate_dead_code"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        graph = program.graph_module.graph
        before = len(graph.nodes)
        # fx keeps impure nodes (in-place/side-effecting ops) and placeholders.
        graph.eliminate_dead_code()
        removed = before - len(graph.nodes)
        if removed:
            program.graph_module.recompile()
        return PassResult(program, modified=removed > 0, info={"nodes_removed": removed})
