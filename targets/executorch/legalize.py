"""ExecuTorch's delegation, without a copy of the whole program per delegate.

``to_backend`` cuts each XNNPACK partition out of the program with
``create_submodule_from_nodes``, which ends with torch's ``legalize_graph``: a topological
sort that copies every node of the program into a new graph and regenerates the module's
Python code. Once per partition, that is quadratic in the program's size: a 300M decoder's
263 delegates spent 80 s there, copying and recompiling a 4,000-node graph each time.

``legalize_in_place`` computes the very order ``legalize_graph`` would (its queue, its
prioritised ops), then moves the nodes into it where they are not already, and leaves
the module's code to be generated once: ``to_backend`` builds its result with a fresh
GraphModule over the graph, which generates the code from the final graph.

    before: per delegate: copy N nodes into a new graph, recompile N nodes
    after:  per delegate: one pass over N nodes to find the order; nodes moved only if needed
"""

from __future__ import annotations

import collections
import contextlib
import operator

import torch

# legalize_graph's own list (torch/fx/passes/tools_common.py): these go to the front of
# the queue, so runtime assertions stay ahead of data-dependent ops
_PRIORITIZED = {
    operator.add, operator.mul, operator.sub, operator.floordiv, operator.truediv,
    operator.mod, operator.le, operator.lt, operator.ge, operator.gt, operator.eq,
    operator.ne, torch.ops.aten.sym_constrain_range.default,
    torch.ops.aten.sym_constrain_range_for_size.default, torch.ops.aten._assert_async.msg,
    torch.ops.aten.scalar_tensor.default, torch.ops.aten._assert_scalar.default,
}


def legalize_order(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The node order ``torch.fx.passes.tools_common.legalize_graph`` produces."""
    indegree = dict.fromkeys(graph.nodes, 0)
    for node in graph.nodes:
        for user in node.users:
            indegree[user] += 1
    queue = collections.deque(node for node in graph.nodes if indegree[node] == 0)
    order = []
    while queue:
        current = queue.popleft()
        order.append(current)
        for user in current.users:
            indegree[user] -= 1
            if indegree[user] == 0:
                if user.op == "call_function" and user.target in _PRIORITIZED:
                    queue.appendleft(user)
                else:
                    queue.append(user)
    if len(order) < len(indegree):
        raise RuntimeError(f"Input graph has cycles, unable to add "
                           f"{[node for node in indegree if indegree[node] != 0]}")
    return order


def legalize_in_place(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``legalize_graph``'s order, by moving nodes within the module's own graph."""
    previous = None
    for node in legalize_order(module.graph):
        if previous is None:
            first = next(iter(module.graph.nodes))
            if first is not node:
                first.prepend(node)
        elif previous.next is not node:
            previous.append(node)
        previous = node
    return module


@contextlib.contextmanager
def delegation_without_copies():
    """Within it, ExecuTorch's partition cutting sorts the program in place."""
    from executorch.exir import lowered_backend_module

    original = lowered_backend_module.legalize_graph
    lowered_backend_module.legalize_graph = lambda module: legalize_in_place(module)
    try:
        yield
    finally:
        lowered_backend_module.legalize_graph = original
