"""What a spec string names, read without importing torch or the model's code: the default
artifact's stem, whether two specs name the same model, and the model file it points at
(a misspelled one is told its near name before anything slow is imported).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from exporter.errors import SpecError
from runtime.errors import did_you_mean

SPEC_FORMS = "expected FILE.py:NAME, package.module:NAME, zoo:NAME or hf:PATH"
# Prefixes whose name alone is the model (zoo:mlp, python:Net from the Python API)
_NAMED_ONLY = ("zoo", "python")
# Factory names that say nothing about the model (make_model, get_net, ModelFactory...):
# the file's stem alone names the artifact, as two files' `factory` must not collide.
_VERBS = ("", "make", "build", "get", "create", "load", "new", "export", "init")
_NOUNS = ("", "model", "models", "net", "network", "module", "spec", "example")
_GENERIC = frozenset(v + n + s for v, n, s in itertools.product(
    _VERBS, _NOUNS, ("", "fn", "factory")) if v + n + s) | {"main", "demo", "run"}


def names_file(where: str) -> bool:
    """``where`` (the part before the last colon) is a file path, not a module name."""
    return where.endswith(".py") or "/" in where or "\\" in where


def default_stem(source: str) -> str:
    """The default artifact's stem: ``models.py:resnet18`` -> ``models-resnet18``,
    ``my_model.py:factory`` -> ``my_model``, ``pkg.nets:make_model`` -> ``nets``,
    ``zoo:mlp`` -> ``mlp``, ``hf:./tiny-bert/`` -> ``tiny-bert`` (``hf:.``: the folder's)."""
    where, colon, name = source.strip().rpartition(":")
    if not colon:
        return _clean(source)
    if where == "hf":
        return _clean(Path(name.rstrip("/\\")).expanduser().resolve().name)
    if where in _NAMED_ONLY or not where:
        return _clean(name)
    stem = Path(where).stem if names_file(where) else where.rsplit(".", 1)[-1]
    factory = name.rsplit(".", 1)[-1]
    if factory.lower().replace("_", "") in _GENERIC or factory == stem:
        return _clean(stem)
    return _clean(f"{stem}-{factory}")


def _clean(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text) or "model"


def same_spec(first: str, second: str) -> bool:
    """Whether two spec strings name one model (``./m.py:f`` and ``m.py:f`` do)."""
    return _key(first) == _key(second)


def _key(spec: str) -> str:
    where, colon, name = spec.strip().rpartition(":")
    if colon and where == "hf":
        return "hf:" + os.path.normpath(os.path.expanduser(name))
    if colon and names_file(where):
        return os.path.normpath(os.path.expanduser(where)) + ":" + name
    return spec.strip()


def check_spec_file(spec: str) -> None:
    """A FILE.py:NAME spec whose file is missing is refused now, naming its near file."""
    where, colon, name = spec.strip().rpartition(":")
    if colon and where and name and where != "hf" and names_file(where):
        existing_file(where, spec.strip())


def spec_reads(spec: str) -> list[Path]:
    """The files a build of ``spec`` reads (its FILE.py, an hf: folder's files), which no
    output of that build may replace."""
    where, colon, name = spec.strip().rpartition(":")
    if where == "hf" and Path(name).expanduser().is_dir():
        return [p for p in Path(name).expanduser().iterdir() if p.is_file()]
    if colon and where and name and names_file(where) and Path(where).expanduser().is_file():
        return [Path(where).expanduser()]
    return []


def existing_file(where: str, text: str) -> Path:
    """The spec's file, resolved; a SpecError when it is missing (with the near file in
    its folder: ``my_modle.py`` -> 'my_model.py') or not a file."""
    path = Path(where).expanduser().resolve()
    if not path.exists():
        said, near = _near_file(path)
        fixed = where[: len(where) - len(Path(where).name)] + near + text[len(where):]
        raise SpecError(f"The model file {where} does not exist{said}", where=str(path),
                        hint=(f"give {fixed}; " if near else "check the path: ")
                        + "a path is relative to the current directory")
    if not path.is_file():
        raise SpecError(f"The model path {where} is not a file", where=str(path),
                        hint=f"{SPEC_FORMS}; give the .py file inside it")
    return path


def _near_file(path: Path) -> tuple[str, str]:
    """(`` (did you mean 'my_model.py'?)``, its name) for the Python file in ``path``'s
    folder nearest its name, or ("", "")."""
    try:
        names = [p.name for p in path.parent.iterdir() if p.suffix == ".py" and p.is_file()]
    except OSError:  # no such folder, or not readable: nothing to suggest
        return "", ""
    said = did_you_mean(path.name, names)
    return said, next((n for n in names if said and f"'{n}'" in said), "")
