"""Nodes XNNPACK's partitioner claims whose XNNPACK kernel computes something else than
torch (ExecuTorch 1.5.1): they stay on ExecuTorch's portable kernels, which compute them
as torch does, and placement and ``--dry-run`` say why.

- ``gelu(approximate='tanh')``: XNNPACK's GELU node has no ``approximate`` flag, and its
  visitor drops the argument: the delegate computes the exact erf GELU (4.7e-4 apart near
  |x| = 2). Every ``gelu_pytorch_tanh`` model (GPT-BigCode, StarCoder2, Gemma 2 and 3)
  missed eager by a few ulp-scaled steps per layer and failed validation.
"""

from __future__ import annotations

import functools
import logging

from torch.fx import Node

log = logging.getLogger(__name__)


def _gelu_approximation(node: Node) -> str | None:
    approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    if approximate != "none":
        return (f"XNNPACK computes gelu(approximate={approximate!r}) as the exact erf GELU "
                "(its GELU node has no approximate flag)")
    return None


# Edge op name (as XNNPACK's configs spell it) -> the check that refuses a node.
_GUARDS = {"gelu.default": _gelu_approximation}


def refusal(node: Node) -> str | None:
    """Why XNNPACK must not take this node although its config would, or None."""
    # an ATen op's name is "gelu.default", its edge twin's "aten.gelu.default"
    name = ".".join(getattr(node.target, "__name__", "").split(".")[-2:])
    guard = _GUARDS.get(name)
    return guard(node) if guard is not None and node.op == "call_function" else None


@functools.cache
def partitioner_configs() -> tuple[type, ...]:
    """XNNPACK's partitioner configs, those of guarded ops refusing what ``refusal`` refuses."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    return tuple(_guarded(config) if config.target_name in _GUARDS else config
                 for config in ALL_PARTITIONER_CONFIGS)


def _guarded(config: type) -> type:
    def check_constraints(self, node, ep) -> bool:
        reason = refusal(node)
        if reason is not None:
            log.debug("XNNPACK leaves %s to the portable kernels: %s", node.name, reason)
            return False
        return config.check_constraints(self, node, ep)

    return type(f"Guarded{config.__name__}", (config,), {"check_constraints": check_constraints})
