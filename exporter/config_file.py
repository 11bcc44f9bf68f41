"""``exporter build --config exporter.toml`` and ``--save-config FILE``: a build as a file.

Keys are ``spec`` and the fields of ``BuildSettings`` (``target``, ``dynamic``,
``memory_budget``...; dashes or underscores), so every flag has a key. Flags given on
the command line win over the file; ``--save-config`` writes what the build used, so
``exporter build --config FILE`` replays it.

    spec = "zoo:encoder"
    target = "onnx"
    dynamic = ["input_ids:0=1..32", "attention_mask:0=1..32"]
    memory_budget = 64000000

The writer is ours (tomllib reads, the standard library writes no TOML): the settings
are flat strings, numbers, booleans and lists of strings.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from exporter.errors import UserInputError
from runtime.outfiles import written_whole

SPEC_KEY = "spec"


def read(path: Path) -> tuple[str | None, dict]:
    """The spec (or None) and the settings fields a config file sets."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserInputError(f"cannot read the config file ({exc.strerror})",
                             where=str(path)) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserInputError(f"the config file is not valid TOML ({exc})", where=str(path),
                             hint="see `exporter build --save-config` for the format") from None
    fields = {key.replace("-", "_"): value for key, value in raw.items()}
    spec = fields.pop(SPEC_KEY, None)
    if spec is not None and not isinstance(spec, str):
        raise UserInputError("the config's spec must be a string", where=str(path))
    return spec, fields


def merge(spec: str | None, cli_fields: dict, given: set[str], config: Path | None
          ) -> tuple[str, dict]:
    """The spec and settings fields: the CLI's defaults, then the file, then the flags
    the command line gave."""
    file_spec, file_fields = read(config) if config else (None, {})
    fields = {**cli_fields, **file_fields, **{k: cli_fields[k] for k in given}}
    spec = spec or file_spec
    if not spec:
        raise UserInputError("no model spec given",
                             hint="give SPEC on the command line or `spec = ...` in --config")
    return spec, fields


def write(path: Path, spec: str, settings) -> Path:
    data = {SPEC_KEY: spec, **settings.model_dump(mode="json", exclude_none=True)}
    lines = [f"{key} = {_value(value)}" for key, value in data.items()]
    with written_whole(path, flag="--save-config") as partial:
        partial.write_text(f"# exporter build --config {path.name}\n" + "\n".join(lines) + "\n")
    return path


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
