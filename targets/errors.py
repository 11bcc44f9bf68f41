"""Errors a target raises about its options (bad usage: exit code 2)."""

from runtime.errors import UserInputError


class TargetOptionError(UserInputError):
    """An option the target does not accept, or cannot honour on this machine."""
