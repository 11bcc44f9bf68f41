"""What a setting is called outside Python: one name for its flag and its --config key.

A field's flag is ``--field-name`` unless ``FLAG_NAMES`` gives it another (the key then
reads like the flag: ``quant_min_sqnr_db`` is ``--min-sqnr`` and ``min_sqnr = 20``); a
target option's flag is its field's ``flag_name``.
"""

from __future__ import annotations

from pydantic.fields import FieldInfo

from targets.registry import described
from targets.options import flag_name

# field -> flag declarations, where not --field-name (the first is the long name)
FLAG_NAMES: dict[str, tuple[str, ...]] = {
    "target": ("--target", "-t"),
    "quant_min_sqnr_db": ("--min-sqnr",), "quant_min_cosine": ("--min-cosine",),
    "validate_artifact": ("--validate/--no-validate",),
    "out": ("--out", "-o"),
}


def config_key(field: str) -> str:
    """A setting's (or target option's) key in a --config file: its flag's long name
    (``quant_min_sqnr_db`` -> ``min_sqnr``, ``validate_artifact`` -> ``validate``), so a
    flag and its key read alike."""
    return _keys().get(field, field)


def config_field(key: str) -> str:
    """The field a --config key names: a flag-named key, or the field name itself."""
    key = key.replace("-", "_")
    return {k: f for f, k in _keys().items()}.get(key, key)


def option_owners() -> dict[str, tuple[FieldInfo, list[str]]]:
    """Target option field -> (its declaration, the targets that take it). Targets sharing
    a field (cpu and cuda share AOTInductor's) must declare it alike: one flag serves both."""
    found: dict[str, tuple[FieldInfo, list[str]]] = {}
    for target in described().values():
        for name, field in target.Options.model_fields.items():
            if name in found:
                first, owners = found[name]
                if (first.annotation, first.default) != (field.annotation, field.default):
                    raise TypeError(f"targets {owners[0]} and {target.name} declare option "
                                    f"'{name}' differently")
                owners.append(target.name)
            else:
                found[name] = (field, [target.name])
    return found


def _keys() -> dict[str, str]:
    def key(decl: str) -> str:
        return decl.split("/")[0].removeprefix("--").replace("-", "_")
    keys = {name: key(decls[0]) for name, decls in FLAG_NAMES.items()}
    keys.update({name: key(flag_name(name, field))
                 for name, (field, _) in option_owners().items()})
    return {field: k for field, k in keys.items() if k != field}
