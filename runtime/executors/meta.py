"""Typed partition metadata: the ``partition.meta`` object a target's lowering writes and
its executor reads back, declared once per executor kind as a frozen dataclass.

A kind subclasses ``PartitionMeta`` with plain annotated fields; parsing and writing are
driven by those annotations, so the two sides cannot drift apart key by key:

* ``to_json()`` is what the lowering puts in the manifest (``None`` fields are left out,
  tuples become lists: the same JSON the bare dicts made, so manifests stay identical);
* ``from_json(raw, where=..., partition=...)`` checks it the way runtime/format/manifest.py checks
  the manifest, raising ArtifactError naming the partition and the key.

Field types understood: ``str``, ``Entry`` (a ``str`` naming one of the artifact's
verified entries, opened as a file by the executor), ``int`` (a count: non-negative),
``bool``, ``float``, ``tuple[X, ...]`` (a JSON list), ``dict[str, X]``, ``dict`` (any JSON
object, for reports the runtime does not interpret), ``Any``, and ``X | None``. A field
without a default is required; optional fields default to ``None`` (or a value). The
constructor checks values the same way (raising TypeError), so a lowering that writes a
wrong value fails at build time.

Unknown keys are tolerated, as runtime/format/manifest.py tolerates unknown optional keys: a
newer toolchain may add an informational key and an older device must still load the
artifact, and lowerings hand their executors extra keys (``compile_seconds``) that the
build moves out of the manifest. A misspelt key cannot come from a lowering that builds
its meta through the dataclass: the constructor refuses unknown keyword arguments.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, NewType, Self

from runtime.errors import ArtifactError

Entry = NewType("Entry", str)  # an artifact entry name; runtime/format/consistency.py checks it

# Bounds for values read from a (possibly hostile) manifest. Entry names, versions,
# provider and op names are short; a compiler note is one line.
MAX_STRING = 4096
MAX_ITEMS = 1 << 16  # items of one list or object field
MAX_COUNT = 1 << 62  # as runtime/format/manifest.py bounds its integers

_REBUILD = "rebuild the artifact with `exporter build`"


class _Bad(Exception):
    """A value that does not fit its field: (where in the field, what is wrong)."""


@dataclasses.dataclass(frozen=True)
class PartitionMeta:
    """Base of every executor kind's metadata. Its one field, keyword-only (so kinds keep
    their own required fields), names the tensors the partition takes from the artifact's
    shared weight store (runtime/memory/shared_weights.py): {name the executor uses: store key}."""

    shared_weights: dict[str, str] | None = dataclasses.field(default=None, kw_only=True)

    @classmethod
    def from_json(cls, raw: Any, *, where: str, partition: str | None = None) -> Self:
        """The checked metadata, or ArtifactError naming ``partition`` and the bad key."""
        bad = f"{f'partition {partition!r}' if partition is not None else 'a partition'} " \
              "has a malformed meta:"
        if not isinstance(raw, dict):
            raise ArtifactError(f"{bad} it is not a JSON object", where=where, hint=_REBUILD)
        values = {}
        for name, hint, required in _schema(cls):
            value = raw.get(name)
            if value is None:
                if required:
                    raise ArtifactError(f"{bad} the required key {name!r} is "
                                        + ("null" if name in raw else "missing"),
                                        where=where, hint=_REBUILD)
                continue  # the field's default
            try:
                values[name] = _parse(value, hint)
            except _Bad as exc:
                at, problem = exc.args
                raise ArtifactError(f"{bad} {name!r}{at} {problem}", where=where,
                                    hint=_REBUILD) from None
        return cls(**values)

    def __post_init__(self) -> None:
        # A lowering builds its meta with this constructor: a value of the wrong type is
        # its bug, said when the artifact is built rather than on the device loading it.
        # (A subclass with a __post_init__ of its own calls this one.)
        for name, hint, required in _schema(type(self)):
            value = getattr(self, name)
            if value is None and required:
                raise TypeError(f"{type(self).__name__}.{name} is required")
            try:  # lists in tuple fields become tuples: the dataclass stays comparable
                object.__setattr__(self, name, _parse(value, hint))
            except _Bad as exc:
                at, problem = exc.args
                raise TypeError(f"{type(self).__name__}.{name}{at} {problem}") from None

    def to_json(self) -> dict:
        """What the lowering writes as ``partition.meta``: fields set to None are omitted."""
        return {f.name: _dump(getattr(self, f.name)) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}

    @classmethod
    def file_keys(cls) -> tuple[str, ...]:
        """The keys whose values the executor opens as files (fields typed ``Entry``)."""
        return tuple(name for name, hint, _ in _schema(cls) if _entry_type(hint))

    def files(self) -> dict[str, str]:
        """{key: entry name} for the file keys this partition sets."""
        return {key: getattr(self, key) for key in self.file_keys()
                if getattr(self, key) is not None}

    @classmethod
    def check_schema(cls) -> None:
        """Raise TypeError now if a field's type is not one ``from_json`` understands
        (for a plug-in registering its kind, rather than at its first artifact)."""
        _schema(cls)


@functools.cache
def _schema(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    """(name, resolved type, required) per field; types are checked once per class."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    schema = []
    for f in dataclasses.fields(cls):
        _check_type(hints[f.name], f"{cls.__name__}.{f.name}")
        required = (f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING)
        schema.append((f.name, hints[f.name], required))
    return tuple(schema)


def _optional(hint: Any) -> Any | None:
    """X for ``X | None`` (or Optional[X]), else None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(rest) == 1 and len(typing.get_args(hint)) == 2:
            return rest[0]
    return None


def _entry_type(hint: Any) -> bool:
    return hint is Entry or _optional(hint) is Entry


def _check_type(hint: Any, what: str) -> None:
    inner = _optional(hint)
    if inner is not None:
        return _check_type(inner, what)
    if hint in (str, Entry, int, bool, float, dict, Any):
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _check_type(args[0], what)
    if origin is dict and len(args) == 2 and args[0] is str:
        return _check_type(args[1], what)
    raise TypeError(f"{what}: partition meta cannot hold a {hint!r} (use str, Entry, int, "
                    "bool, float, tuple[X, ...], dict[str, X], dict, Any, or X | None)")


def _parse(value: Any, hint: Any) -> Any:
    """``value`` checked against ``hint`` (a type _check_type accepted), else _Bad."""
    inner = _optional(hint)
    if inner is not None:
        return None if value is None else _parse(value, inner)
    if hint is Any:
        return value
    if hint in (str, Entry):
        if not isinstance(value, str):
            raise _Bad("", f"must be a string, not {_kind(value)}")
        if len(value) > MAX_STRING:
            raise _Bad("", f"is a string of {len(value)} characters (at most {MAX_STRING})")
        return value
    if hint is bool:
        if type(value) is not bool:
            raise _Bad("", f"must be true or false, not {_kind(value)}")
        return value
    if hint is int:
        if type(value) is not int or not 0 <= value < MAX_COUNT:
            raise _Bad("", f"must be a non-negative integer below 2**62, not {value!r:.40}")
        return value
    if hint is float:
        if type(value) not in (int, float) or not math.isfinite(value):
            raise _Bad("", f"must be a finite number, not {value!r:.40}")
        return value  # an int stays one: written back, the JSON is unchanged
    if hint is dict:
        return dict(_sized(value, dict, "an object"))
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        return tuple(_at(f"[{i}]", item, args[0])
                     for i, item in enumerate(_sized(value, (list, tuple), "a list")))
    # dict[str, X]: keys are bounded strings too
    result = {}
    for key, item in _sized(value, dict, "an object").items():
        if len(key) > MAX_STRING:
            raise _Bad("", f"has a key of {len(key)} characters (at most {MAX_STRING})")
        result[key] = _at(f"[{key[:80]!r}]", item, args[1])
    return result


def _at(step: str, value: Any, hint: Any) -> Any:
    """Parse an item, prefixing its place (``[2]``, ``['params']``) to any complaint."""
    try:
        return _parse(value, hint)
    except _Bad as exc:
        raise _Bad(step + exc.args[0], exc.args[1]) from None


def _sized(value: Any, kind: type | tuple[type, ...], said: str) -> Any:
    if not isinstance(value, kind):
        raise _Bad("", f"must be {said}, not {_kind(value)}")
    if len(value) > MAX_ITEMS:
        raise _Bad("", f"has {len(value)} items (at most {MAX_ITEMS})")
    return value


def _kind(value: Any) -> str:
    return {type(None): "null", bool: "a boolean", int: "an integer", float: "a number",
            str: "a string", list: "a list", dict: "an object"}.get(type(value),
                                                                     type(value).__name__)


def _dump(value: Any) -> Any:
    """JSON form of a field value: tuples as lists, containers copied."""
    if isinstance(value, tuple):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value
