"""Errors a target raises: about its options (bad usage: exit code 2), and one class for
any backend failing on a partition (exit code 3)."""

from runtime.errors import ToolchainError, UserInputError


class TargetOptionError(UserInputError):
    """An option the target does not accept, or cannot honour on this machine."""


class LoweringError(ToolchainError):
    """A backend failed on a partition (exit code 3). ``nodes`` names the graph nodes it
    failed on; the build moves them to the CPU fallback and lowers again (unless
    --fallback forbid). A target that cannot tell which ops failed leaves it empty and
    the build moves the whole partition."""

    def __init__(self, *args, nodes: list[str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.nodes = list(nodes or [])
