"""Load a model spec string into a module, example args and dynamic shapes.

A spec names a factory: a callable taking no arguments that returns
``(module, example_args)``, ``(module, example_args, dynamic_shapes)``,
``(module, example_args, example_kwargs)`` or
``(module, example_args, example_kwargs, dynamic_shapes)``. A third element that is a
dict of tensors keyed by ``forward()``'s parameter names is taken as keyword args (Hugging
Face models take ``input_ids``, ``pixel_values``, ``decoder_input_ids`` by name).

- ``path/to/file.py:NAME``: the file is imported by path as a fresh module, its
  directory on ``sys.path`` while it is imported and the factory runs (so sibling
  imports work).
- ``package.module:NAME``: imported with importlib from ``sys.path`` plus the working
  directory.
- ``zoo:NAME``: a built-in model (``exporter.model.zoo``), no file needed.
- ``hf:PATH``: a local Hugging Face checkpoint folder (``exporter.model.hf_spec``).

``example_args`` is a tuple or list of positional args, or a single tensor (wrapped
into a 1-tuple). Args may be tensors, nested
tuples/lists/dicts of tensors, None, int, float or bool. ``dynamic_shapes`` is passed
to torch.export as given (its own format). The module is put in eval mode (given back
as it was after a Python API call: ``given_module.factories_left_as_given``).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import itertools
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from exporter.errors import SpecError
from exporter.model.given_module import factory_made
from exporter.model.source_lines import SourceLine, find_user_frame
from exporter.model import spec_modules
from exporter.model.hf_spec import HfOptions, load_hf
from exporter.model.spec_names import SPEC_FORMS, existing_file, names_file
from runtime.errors import did_you_mean

_FACTORY_CONTRACT = ("(module, example_args), (module, example_args, dynamic_shapes), "
                     "(module, example_args, example_kwargs) or "
                     "(module, example_args, example_kwargs, dynamic_shapes)")
_SCALARS = (int, float, bool, type(None))
_fresh_ids = itertools.count()


@dataclass
class ModelSpec:
    source: str  # the spec string as given
    module: torch.nn.Module  # in eval mode
    args: tuple
    kwargs: dict
    dynamic_shapes: Any | None  # torch.export format, as the factory returned it
    origin_file: str | None  # file the model came from: error messages point into it
    notes: list[str] = field(default_factory=list)  # warnings for the build (random weights)
    # Names for the outputs where the model returns a bare tensor (hf: the task's field,
    # ``logits``); None: named from the output's structure (capture.output_names)
    output_names: tuple[str, ...] | None = None
    # What the loader chose, for the manifest's source and the build's summary (hf: task,
    # model_class, seq_len or image_size); a key the user's settings left open is recorded
    details: dict = field(default_factory=dict)
    # Dims its inputs share, by name ("batch" -> ((input_ids, 0), (attention_mask, 0))), and
    # its example args made again at other sizes of them (hf:; exporter/model/example_dims.py)
    groups: dict = field(default_factory=dict)
    remake: Callable[[dict], tuple] | None = None

    @property
    def model_class(self) -> str:
        """The model's own class (hf: BertForSequenceClassification, not our wrapper)."""
        return self.details.get("model_class") or type(self.module).__qualname__


def load_spec(spec: str, hf: HfOptions | None = None, *, module_only: bool = False
              ) -> ModelSpec:
    """Resolve ``spec`` to a ModelSpec; every user mistake is a SpecError. ``hf`` (task,
    sequence length, image size) applies to ``hf:PATH`` specs only. ``module_only``: the
    factory may return the module alone (text generation makes its own inputs)."""
    text = (spec or "").strip()
    if not text:
        raise SpecError("The model spec is empty", hint=f"{SPEC_FORMS}, e.g. zoo:mlp")
    target, colon, name = text.rpartition(":")
    if not colon or not target or not name:
        raise SpecError(f"The model spec {text!r} does not name a factory", where=text,
                        hint=f"{SPEC_FORMS}, e.g. model.py:make_model or zoo:mlp")
    if hf is not None and hf != HfOptions() and target != "hf":
        raise SpecError("--task, --seq-len, --image-size, --batch-size, --random-weights, "
                        "--trust-remote-code and --max-model-size apply to hf:PATH specs only",
                        where=text, hint="drop them, or give hf:PATH")
    if target == "zoo":
        return _from_zoo(text, name)
    if target == "hf":
        loaded = load_hf(text, name, hf or HfOptions())
        return ModelSpec(text, loaded.module, loaded.args, {}, None, None, loaded.notes,
                         (loaded.output,), loaded.details, loaded.groups, loaded.remake)
    if names_file(target):
        path = existing_file(target, text)
        with _on_sys_path(path.parent):
            module = _import_file(path)
            return _from_factory(text, _lookup(module, name, str(path)), str(path),
                                 module_only)
    # The console script does not put the working directory on sys.path, but users
    # expect `exporter build mymodels.net:make` to find ./mymodels (as uvicorn does).
    with _on_sys_path(Path.cwd()):
        module = _import_module(target, text)
        origin = getattr(module, "__file__", None)
        return _from_factory(text, _lookup(module, name, origin or target), origin,
                             module_only)


# ---------------------------------------------------------------------------- finding the factory


def _from_zoo(text: str, name: str) -> ModelSpec:
    from exporter.model.zoo import ZOO, describe
    from exporter.model.zoo_trained import DESCRIPTIONS, TRAINED

    models = {**ZOO, **TRAINED}
    if name not in models:
        raise SpecError(f"There is no zoo model named {name!r}", where=text,
                        hint=f"use one of zoo:{', zoo:'.join(models)}",
                        details=[f"zoo:{n}: {d}"
                                 for n, d in {**describe(), **DESCRIPTIONS}.items()])
    return _from_factory(text, models[name], inspect.getsourcefile(models[name]))


@contextmanager
def _on_sys_path(folder: Path) -> Iterator[None]:
    entry = str(folder)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        if entry in sys.path:  # the user's code may have edited sys.path itself
            sys.path.remove(entry)


class _SourceAsItIs(importlib.machinery.SourceFileLoader):
    """Compiles the file as it is now: cached bytecode is checked by the source's mtime in
    whole seconds and its size, so an edit within a second that keeps the size ran the old
    code wherever Python writes bytecode (its default)."""

    def get_code(self, fullname):
        return self.source_to_code(self.get_data(self.path), self.path)


def _import_file(path: Path):
    # A file already run and unchanged is reused (spec_modules.py says why). Otherwise a
    # unique name per load: two specs in files both called model.py must not collide, and
    # re-loading picks up edits. Registered in sys.modules for dataclasses/pickle.
    earlier = spec_modules.loaded_before(path)
    if earlier is not None:
        return earlier
    name = f"_exporter_spec_{path.stem}_{next(_fresh_ids)}"
    module_spec = importlib.util.spec_from_file_location(
        name, path, loader=_SourceAsItIs(name, str(path)) if path.suffix == ".py" else None)
    if module_spec is None or module_spec.loader is None:
        raise SpecError(f"Python cannot import {path.name}", where=str(path),
                        hint="the model file must be a Python source file ending in .py")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # user code: the user's error, reported
        del sys.modules[name]
        raise _user_code_failed(f"Importing {path.name} failed", exc, str(path)) from exc
    spec_modules.remember(path, module)
    return module


def _import_module(target: str, text: str):
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name and (target == exc.name or target.startswith(exc.name + ".")):
            raise SpecError(f"There is no Python module named {target!r}", where=text,
                            hint=f"{SPEC_FORMS}; check the spelling, run from the directory "
                                 "that holds the package, or give a file path") from exc
        raise _user_code_failed(f"Importing {target} failed", exc, target) from exc
    except (Exception, SystemExit) as exc:  # user code: the user's error, reported
        raise _user_code_failed(f"Importing {target} failed", exc, target) from exc


def _lookup(module, name: str, where: str) -> Callable:
    if not hasattr(module, name):
        defined = _factories_in(module)
        have = f"it defines: {', '.join(defined)}" if defined else "it defines no functions"
        near = did_you_mean(name, _callables_in(module))
        raise SpecError(f"{where} has no attribute {name!r}{near}", where=where,
                        hint=f"name one of the functions it defines ({have})")
    factory = getattr(module, name)
    if not callable(factory):
        raise SpecError(f"{name!r} in {where} is a {type(factory).__name__}, not a callable",
                        where=where, hint=f"point the spec at a function returning "
                                          f"{_FACTORY_CONTRACT}")
    return factory


def _factories_in(module) -> list[str]:
    """Public functions defined in the module itself (not imported ones like torch.randn)."""
    return sorted(n for n, v in vars(module).items()
                  if inspect.isfunction(v) and not n.startswith("_")
                  and v.__module__ == module.__name__)


def _callables_in(module) -> list[str]:
    """Every top-level callable the module defines itself (functions, classes, partials),
    private ones too: what a misspelled factory name is compared with."""
    return [n for n, v in vars(module).items() if callable(v) and not n.startswith("__")
            and not inspect.ismodule(v)
            and getattr(v, "__module__", module.__name__) == module.__name__]


def _user_code_failed(what: str, exc: BaseException, where: str) -> SpecError:
    frame = find_user_frame(exc)
    if isinstance(exc, SyntaxError) and exc.filename:  # no frame of its own: the parser failed
        where = str(SourceLine(exc.filename, exc.lineno or 0, "", (exc.text or "").strip()))
        exc_text = exc.msg
    else:
        where, exc_text = (str(frame) if frame else where), str(exc)
    if isinstance(exc, SystemExit):
        exc_text = f"sys.exit({exc.code!r}) was called; a spec must return, not exit"
    return SpecError(f"{what}: {type(exc).__name__}: {exc_text}".rstrip(": "), where=where,
                     hint="fix the error in the model code; run the file with python to see "
                          "the full traceback")


# ---------------------------------------------------------------------------- checking its result


def _from_factory(text: str, factory: Callable, origin: str | None,
                  module_only: bool = False) -> ModelSpec:
    name = getattr(factory, "__qualname__", repr(factory))
    try:
        # seeded: a factory that draws random weights (the README's) gives the same model
        # to `exporter validate` as it gave the build; the caller's RNG is left alone
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            result = factory()
    except (Exception, SystemExit) as exc:  # user code: the user's error, reported
        # sys.exit() in a factory is not a successful build (exit 0, no artifact)
        raise _user_code_failed(f"The factory {name}() raised", exc, origin or text) from exc
    if module_only:
        module = result[0] if isinstance(result, (tuple, list)) and result else result
        if not isinstance(module, torch.nn.Module):
            raise SpecError(f"{name}() returned {_describe(result)}, not a torch.nn.Module",
                            where=text, hint="return the model (alone or first in a tuple)")
        return ModelSpec(source=text, module=factory_made(module).eval(), args=(), kwargs={},
                         dynamic_shapes=None, origin_file=_model_file(module, origin))
    module, args, kwargs, dynamic_shapes = _unpack(result, name, text)
    args = _as_args(args, name, text)
    _check_leaves(args, "example_args", name, text)
    _check_leaves(kwargs, "example_kwargs", name, text)
    if dynamic_shapes is not None and not isinstance(dynamic_shapes, (tuple, list, dict)):
        raise SpecError(f"{name}() returned dynamic_shapes of type {type(dynamic_shapes).__name__}",
                        where=text, hint="return torch.export's format: a tuple with one "
                                         "{dim: Dim(...)} dict or None per argument, or None")
    return ModelSpec(source=text, module=factory_made(module).eval(), args=args, kwargs=kwargs,
                     dynamic_shapes=dynamic_shapes, origin_file=_model_file(module, origin))


def _describe(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        inner = ", ".join(type(v).__name__ for v in value[:4])
        more = ", ..." if len(value) > 4 else ""
        return f"a {type(value).__name__} of {len(value)} ({inner}{more})"
    return f"a {type(value).__name__}"


def _unpack(result: Any, name: str, text: str) -> tuple[torch.nn.Module, Any, dict, Any]:
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3, 4):
        hint = f"return {_FACTORY_CONTRACT}"
        if isinstance(result, torch.nn.Module):
            hint += ", e.g. `return model, (torch.randn(1, 3, 224, 224),)`"
        raise SpecError(f"{name}() returned {_describe(result)}; expected {_FACTORY_CONTRACT}",
                        where=text, hint=hint)
    module = result[0]
    if not isinstance(module, torch.nn.Module):
        is_class = isinstance(module, type) and issubclass(module, torch.nn.Module)
        hint = ("return an instance (call the class: `Model()`), not the class" if is_class
                else "the first element must be the torch.nn.Module to export")
        raise SpecError(f"{name}() returned {_describe(module)} as its first element, not a "
                        "torch.nn.Module", where=text, hint=hint)
    rest = list(result[2:])
    kwargs = rest.pop(0) if rest and _is_kwargs(rest[0], module, len(rest)) else {}
    if len(rest) > 1 or (len(result) == 4 and not kwargs and result[2] not in ({}, None)):
        raise SpecError(f"{name}() returned {_describe(result)}; expected {_FACTORY_CONTRACT}",
                        where=text, hint="with four elements the third must be a dict of "
                                         "keyword args for forward()")
    return module, result[1], kwargs or {}, rest[0] if rest else None


def _is_kwargs(value: Any, module: torch.nn.Module, remaining: int) -> bool:
    """A dict third element is keyword args when it is followed by dynamic shapes, or
    when its keys name ``forward()`` parameters and its values are not ``Dim`` specs
    (torch.export's dynamic_shapes may also be a dict keyed by parameter name)."""
    if value is None and remaining == 2:
        return True  # (module, args, None, dynamic_shapes)
    if not isinstance(value, dict):
        return False
    if remaining == 2:
        return True
    return bool(value) and not any(isinstance(v, dict) or v is None or _is_dim_spec(v)
                                   for v in value.values())


def _is_dim_spec(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and all(
        v is None or isinstance(v, int) or hasattr(v, "__name__") for v in value)  # Dims are named


def _as_args(args: Any, name: str, text: str) -> tuple:
    if isinstance(args, torch.Tensor):
        return (args,)
    if isinstance(args, (tuple, list)):
        return tuple(args)
    hint = "return example args as a tuple, e.g. (x,) or (input_ids, attention_mask)"
    if isinstance(args, dict):
        hint = ("keyword args go third: return (module, (), {'input_ids': ids, ...}), or pass "
                "them positionally in forward()'s parameter order")
    raise SpecError(f"{name}() returned example args of type {type(args).__name__}", where=text,
                    hint=hint)


def _check_leaves(value: Any, path: str, name: str, text: str) -> None:
    """Only what torch.export can feed to a graph: tensors, containers of them, scalars."""
    if isinstance(value, (torch.Tensor, *_SCALARS)):
        return
    if isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            _check_leaves(item, f"{path}[{i}]", name, text)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _check_leaves(item, f"{path}[{key!r}]", name, text)
        return
    raise SpecError(f"{name}() returned {path} of type {type(value).__name__}, which cannot be "
                    "a model input", where=text,
                    hint="example args may hold tensors, tuples/lists/dicts of tensors, None, "
                         "int, float or bool; convert it (e.g. torch.as_tensor) or build it "
                         "inside the model")


def _model_file(module: torch.nn.Module, origin: str | None) -> str | None:
    """The model class's file when it is user code, else the file that held the factory."""
    try:
        model_file = inspect.getsourcefile(type(module))
    except TypeError:  # classes made at runtime have no file
        model_file = None
    if model_file and not model_file.startswith(str(Path(torch.__file__).parent)):
        return model_file
    return origin
