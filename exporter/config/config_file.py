"""``exporter build --config exporter.toml`` and ``--save-config FILE``: a build as a file.

Keys are ``spec`` and the build's flags without their dashes (``target``, ``dynamic``,
``memory_budget``, ``min_sqnr``, ``validate``...; dashes or underscores; the
``BuildSettings`` field names are read too), so every flag has a key named like it; a target's own
options go in a table named after it (``[onnx]``, ``ep = "cuda,cpu"``; only the table of
the target built is used, so one file can hold several). Flags given on
the command line win over the file; ``--save-config`` writes what the build used, so
``exporter build --config FILE`` replays it.

    spec = "zoo:encoder"
    target = "onnx"
    dynamic = ["input_ids:0=1..32", "attention_mask:0=1..32"]
    memory_budget = 64000000

    [onnx]
    ep = "cpu"

Paths in the file (the spec's FILE.py or hf:FOLDER, ``out``, ``inputs``, ``calibration``)
are relative to the file's own folder, as in pyproject.toml, so a replay from another
directory builds the same model. ``--save-config`` also stores ``spec_sha256``, the hash of
the model's source file (hf: its config.json); a replay whose file changed since is refused.

The writer is ours (tomllib reads, the standard library writes no TOML): the settings
are flat strings, numbers, booleans and lists of strings.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from pathlib import Path

from exporter.errors import UserInputError
from exporter.config.keys import config_field, config_key
from runtime.host.outfiles import written_whole
from targets.registry import described

SPEC_KEY = "spec"
HASH_KEY = "spec_sha256"
_PATH_FIELDS = ("out", "inputs", "calibration")
_NOT_PATHS = {"calibration": "random"}  # a field's word that names no file


def read(path: Path) -> tuple[str | None, dict]:
    """The spec (or None) and the settings fields a config file sets."""
    return fields_of(load_toml(path), path.parent, str(path))


def load_toml(path: Path, what: str = "config file",
              hint: str = "see `exporter build --save-config` for the format") -> dict:
    """The file's keys; an unreadable or malformed file is a UserInputError (exit 2)."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserInputError(f"cannot read the {what} ({exc.strerror})",
                             where=str(path)) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserInputError(f"the {what} is not valid TOML ({exc})", where=str(path),
                             hint=hint) from None


def fields_of(raw: dict, folder: Path, where: str) -> tuple[str | None, dict]:
    """The spec (or None) and settings fields of one table of config keys (a config file,
    or a model's or target's table in ``exporter matrix``'s file), its paths made relative
    to ``folder``."""
    fields = {config_field(key): value for key, value in raw.items()}
    spec, expected = fields.pop(SPEC_KEY, None), fields.pop(HASH_KEY, None)
    if spec is not None and not isinstance(spec, str):
        raise UserInputError("the config's spec must be a string", where=where)
    for key in _PATH_FIELDS:
        if _is_path(key, fields.get(key)):
            fields[key] = _under(folder, fields[key])
    if spec is not None:
        spec = _with_location(spec, lambda loc: _under(folder, loc))
        if expected is not None:
            _check_hash(spec, expected, Path(where))
    return spec, fields


def _is_path(key: str, value) -> bool:
    return isinstance(value, str) and value != _NOT_PATHS.get(key)


def _under(folder: Path, location: str) -> str:
    """``location`` from the file's folder, normalised: a config written into a matrix's
    cells/ folder names ``../../models/x.py``, and the artifact records its spec, which
    must not depend on where the matrix wrote its output."""
    return os.path.normpath(folder / Path(location).expanduser())


def merge(spec: str | None, cli_fields: dict, given: set[str], config: Path | None
          ) -> tuple[str, dict]:
    """The spec and settings fields: the CLI's defaults, then the file, then the flags
    the command line gave."""
    file_spec, file_fields = read(config) if config else (None, {})
    fields = with_target_table({**cli_fields, **file_fields,
                                **{k: cli_fields[k] for k in given}})
    spec = spec or file_spec
    if not spec:
        raise UserInputError("no model spec given",
                             hint="give SPEC on the command line or `spec = ...` in --config")
    return spec, fields


def with_target_table(fields: dict) -> dict:
    """Fields with the table named after their target as its options (flat option keys
    stay flat, and BuildSettings lets them win); other targets' tables are dropped."""
    fields = dict(fields)
    tables = {name: fields.pop(name) for name in described() if isinstance(fields.get(name), dict)}
    table = tables.get(str(fields.get("target")))
    if table is not None:
        fields["target_options"] = {config_field(k): v for k, v in table.items()}
    return fields


def write(path: Path, spec: str, settings) -> Path:
    folder = path.expanduser().resolve().parent

    def relative(location: str) -> str:
        return os.path.relpath(Path(location).expanduser().resolve(), folder)
    data = {SPEC_KEY: _with_location(spec, relative)}
    digest = _source_hash(spec)
    if digest:
        data[HASH_KEY] = digest
    data.update(settings.model_dump(mode="json", exclude_none=True, exclude={"force"}))
    options = {k: v for k, v in data.pop("target_options", {}).items() if v is not None}
    for key in _PATH_FIELDS:
        if _is_path(key, data.get(key)):
            data[key] = relative(data[key])
    lines = [f"{config_key(key)} = {_value(value)}" for key, value in data.items()]
    if options:  # a TOML table comes after the top-level keys
        lines += ["", f"[{settings.target}]"] + [f"{config_key(k)} = {_value(v)}"
                                                 for k, v in options.items()]
    with written_whole(path, flag="--save-config") as partial:
        partial.write_text(f"# exporter build --config {path.name}\n" + "\n".join(lines) + "\n")
    return path


def spec_location(spec: str) -> tuple[str, str, str] | None:
    """(prefix, path, suffix) of a spec that names a file or folder, else None: ``hf:``
    folders and ``FILE.py:factory`` (zoo: and module specs name no path)."""
    if spec.startswith("hf:"):
        return "hf:", spec[3:], ""
    target, colon, name = spec.rpartition(":")
    if colon and (target.endswith(".py") or "/" in target or "\\" in target):
        return "", target, ":" + name
    return None


def _with_location(spec: str, change) -> str:
    """``spec`` with its path (if it names one) replaced by ``change(path)``."""
    parts = spec_location(spec)
    if parts is None:
        return spec
    prefix, location, suffix = parts
    return prefix + change(location) + suffix


def _source_file(spec: str) -> Path | None:
    parts = spec_location(spec)
    if parts is None:
        return None
    prefix, location, _ = parts
    path = Path(location).expanduser()
    return path / "config.json" if prefix == "hf:" else path


def _source_hash(spec: str) -> str | None:
    source = _source_file(spec)
    if source is None or not source.is_file():
        return None
    return hashlib.sha256(source.read_bytes()).hexdigest()


def _check_hash(spec: str, expected: object, config: Path) -> None:
    source = _source_file(spec)
    got = _source_hash(spec)
    if got is None:
        raise UserInputError(f"the model file the config names, {source}, does not exist",
                             where=str(config), hint="paths in a config file are relative to "
                             "the file's folder; keep them together")
    if got != expected:
        raise UserInputError(f"{source} changed since the config was saved (its SHA-256 is "
                             f"{got[:16]}..., the config recorded {str(expected)[:16]}...): "
                             "replaying it would build a different model", where=str(config),
                             hint="build from the changed file with a new --save-config, or "
                                  f"delete the {HASH_KEY} line to accept the change")


def _value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")
