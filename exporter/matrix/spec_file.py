"""The matrix file (``exporter matrix MATRIX.toml``): models, target recipes, how cells run.

    timeout = 900          # seconds per cell: build, validation and bench (default 900)
    retries = 2            # --executor ray: reruns of a cell whose worker died (default 2)
    warm_start = "auto"    # Linux: cells fork from a worker that imported torch once;
                           # "auto" (default): the cells that use no GPU; true: all;
                           # false: each cell a fresh `python -m exporter`

    [defaults]             # `exporter build --config` keys every cell gets
    seed = 0

    [models]               # NAME = SPEC, or a table: spec, the model's own build keys
    mlp = "zoo:mlp"        # (hf options, inputs, dynamic...), group (a label for the
    mine = "models/mine.py:make"             # table), depends (files the factory reads)
    bert = { spec = "hf:ckpt/bert", task = "text-classification", seq_len = 32 }

    [targets.onnx]         # one column per table: `exporter build --config` keys;
    [targets.cpu-fp16]     # `target` is the table's name unless given
    target = "cpu"
    dtype = "fp16"
    [targets.tvm-tuned]
    target = "tvm"
    tvm = { tune = 8 }     # the target's own options: a table named after it, as in --config

    [bench]                # optional: time each artifact that built (`exporter bench`)
    runs = 50
    warmup = 10
    baseline = "eager"

A cell's settings are the defaults, then its column's keys, then its model's (a model's
keys are about that model, so they win); they are checked as BuildSettings before anything
runs, so a typo fails the command (exit 2) rather than every cell. Paths are relative to
the file's folder, as in ``--config``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from exporter.config.config_file import fields_of, load_toml, with_target_table
from exporter.errors import UserInputError
from exporter.settings import BuildSettings
from targets import all_targets

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # models and columns name files
_MODEL_ONLY = ("spec", "group", "depends")
_HINT = "the format is in docs/matrix.md"


class BenchSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    runs: int = Field(50, ge=1)
    warmup: int = Field(10, ge=0)
    baseline: str = "eager"


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    timeout: float = Field(900.0, gt=0, allow_inf_nan=False)
    retries: int = Field(2, ge=0)
    warm_start: StrictBool | Literal["auto"] = "auto"  # docs/matrix.md
    defaults: dict = Field(default_factory=dict)
    models: dict[str, str | dict] = Field(min_length=1)
    targets: dict[str, dict] = Field(min_length=1)
    bench: BenchSettings | None = None


@dataclass(frozen=True)
class Cell:
    model: str
    column: str
    spec: str
    settings: BuildSettings
    group: str | None = None
    depends: tuple[str, ...] = ()  # files the model's factory reads (in the cache key)

    @property
    def id(self) -> str:
        """A file name: models and columns are named with [A-Za-z0-9_.-]."""
        return f"{self.model}--{self.column}"


@dataclass(frozen=True)
class Matrix:
    path: Path
    models: list[str]
    columns: list[str]
    cells: list[Cell]
    timeout: float
    retries: int
    bench: BenchSettings | None
    recipes: dict[str, dict]  # column -> the keys its table sets (for the table's header)
    warm_start: bool | Literal["auto"] = "auto"  # cells fork from a warm worker (warm.py)


def read(path: Path) -> Matrix:
    path = Path(path)
    raw = load_toml(path, "matrix file", hint=_HINT)
    try:
        data = _File(**raw)
    except pydantic.ValidationError as exc:
        raise UserInputError("the matrix file is not as expected", where=str(path),
                             details=[_problem(e) for e in exc.errors()],
                             hint=_HINT) from None
    folder = path.resolve().parent
    for name in [*data.models, *data.targets]:
        if not _NAME.fullmatch(name):
            raise UserInputError(f"{name!r} cannot name a model or target column: use letters, "
                                 "digits, '_', '.' and '-'", where=str(path))
    defaults = _keys(data.defaults, folder, path, "defaults", forbid=("spec", "target", "out"))
    columns = {name: _column(name, table, folder, path) for name, table in data.targets.items()}
    cells = [_cell(name, entry, column, fields, defaults, folder, path)
             for name, entry in data.models.items() for column, fields in columns.items()]
    _refuse_same_ids(cells, path)
    return Matrix(path, list(data.models), list(data.targets), cells, data.timeout,
                  data.retries, data.bench, columns, data.warm_start)


def _column(name: str, table: dict, folder: Path, path: Path) -> dict:
    fields = {"target": name, **_keys(table, folder, path, f"targets.{name}",
                                      forbid=("spec", "out"))}
    known = all_targets()
    if fields["target"] not in known:
        close = difflib.get_close_matches(str(fields["target"]), known, n=1)
        raise UserInputError(f"targets.{name}: unknown target {fields['target']!r}",
                             where=str(path), hint=(f"did you mean {close[0]!r}? " if close
                                                    else "") + "known: " + ", ".join(known)
                             + "; a column named otherwise says target = \"...\"")
    return fields


def _cell(model: str, entry: str | dict, column: str, column_fields: dict, defaults: dict,
          folder: Path, path: Path) -> Cell:
    entry = {"spec": entry} if isinstance(entry, str) else dict(entry)
    where = f"models.{model}"
    group, depends = entry.pop("group", None), entry.pop("depends", [])
    if not isinstance(entry.get("spec"), str):
        raise UserInputError(f"{where} needs spec = \"...\" (a string)", where=str(path))
    if not isinstance(depends, list) or not all(isinstance(d, str) for d in depends):
        raise UserInputError(f"{where}.depends must be a list of paths", where=str(path))
    spec, own = fields_of(entry, folder, str(path))
    _refuse(own, ("target", "out"), where, path)
    fields = with_target_table({**defaults, **column_fields, **own})
    try:
        settings = BuildSettings(**fields)
    except pydantic.ValidationError as exc:
        raise UserInputError(f"invalid build options for model {model} on {column}",
                             where=str(path), details=[_problem(e) for e in exc.errors()]
                             ) from None
    depends = tuple((folder / d).resolve() for d in depends)
    missing = [str(d) for d in depends if not d.is_file()]
    if missing:  # a typo would leave the real file out of the cache key, unseen
        raise UserInputError(f"{where}.depends names no file at {', '.join(missing)}",
                             where=str(path), hint="depends paths are relative to the "
                                                   "matrix file's folder")
    return Cell(model, column, spec, settings, str(group) if group is not None else None,
                tuple(map(str, depends)))


def _refuse_same_ids(cells: list[Cell], path: Path) -> None:
    """A cell's id names its config, artifact and row: model "a" on column "b--onnx" and
    model "a--b" on "onnx" would share one and a cell would vanish from the table."""
    seen: dict[str, Cell] = {}
    for cell in cells:
        other = seen.setdefault(cell.id, cell)
        if other is not cell:
            raise UserInputError(
                f"model {other.model!r} on {other.column!r} and model {cell.model!r} on "
                f"{cell.column!r} would both be cell {cell.id!r}", where=str(path),
                hint="rename a model or a target column (a cell is named MODEL--COLUMN, so "
                     "avoid '--' in names)")


def _keys(table: dict, folder: Path, path: Path, where: str, forbid: tuple[str, ...]) -> dict:
    spec, fields = fields_of(table, folder, str(path))
    _refuse({**fields, **({"spec": spec} if spec else {})}, forbid, where, path)
    _refuse(fields, _MODEL_ONLY, where, path)
    return fields


def _refuse(fields: dict, keys: tuple[str, ...], where: str, path: Path) -> None:
    given = [k for k in keys if k in fields]
    if given:
        raise UserInputError(f"{where} cannot set {', '.join(given)}", where=str(path),
                             hint="a model's table sets spec and its own keys, a target's "
                                  "table the recipe; the matrix chooses each artifact's path")


def _problem(error: dict) -> str:
    where, message = ".".join(map(str, error["loc"])), error["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message
