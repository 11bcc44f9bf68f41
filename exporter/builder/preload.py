"""What the validation process imports before it loads an artifact, as a device would
have to: the code that registers the custom ops a CPU-fallback partition calls, and the
modules of a plug-in target's executor (``runtime --preload``)."""

from __future__ import annotations

import importlib.util
import os
import re
import site
import sys
import sysconfig
from pathlib import Path

from runtime.format.manifest import Manifest
from targets import for_backend


def preload_for(manifest: Manifest, origin_file: str | None) -> list[str]:
    """The modules that register a plug-in target's executor
    (``Target.packaging.runtime_modules``), and for custom ops in CPU-fallback partitions
    their defining code: the installed module that registered the op
    (``transformers.integrations.moe`` for Mixtral's ``grouped_mm_fallback``), else the
    model's own file, by module name when it belongs to an installed package (a package's
    file imported alone fails on its relative imports)."""
    sources: list[str] = []
    for partition in manifest.partitions:  # custom ops: the modules manifest_for found
        target, modules = for_backend(partition.backend), partition.meta.get("custom_op_modules")
        plugin = target.packaging.runtime_modules if target else ()
        for source in [*plugin,  # (older: look them up)
                       *((modules or {}).get(op) or defining_module(op) or _model_code(origin_file)
                         for op in partition.meta.get("custom_ops", []))]:
            if source and source not in sources:
                sources.append(source)
    return sources


def _model_code(origin_file: str | None) -> str | None:
    """The model's own code as ``runtime --preload`` takes it: a module name or a path."""
    return origin_file and (importable_name(origin_file) or origin_file)


def defining_module(qualified: str) -> str | None:
    """The importable module a custom op was defined in: a ``torch.library.custom_op``'s
    function's, else the installed file a ``torch.library.Library`` defined it from
    (torchao's ``dequantize_affine``: ``torchao.quantization.quant_primitives``); None
    for ops of the model file itself, of C++ libraries, or unknown."""
    from torch._library.custom_ops import OPDEFS
    namespace, _, name = qualified.rpartition(".")  # 'transformers.grouped_mm_fallback'
    definition = OPDEFS.get(f"{namespace}::{name}")
    module = getattr(getattr(definition, "_init_fn", None), "__module__", None)
    if definition is None:
        return _library_module(f"{namespace}::{name}")
    if not module or module == "__main__" or module.startswith("_exporter_spec_"):
        return None
    # a module imported from a plain folder (the user's own model file, imported before
    # the build reused it): a fresh process need not find it by name; the file, by path
    file = getattr(sys.modules.get(module), "__file__", None)
    if file and importable_name(file) is None:
        return None
    return module


_REGISTERED_AT = re.compile(r"^debug: registered at (.+\.py):\d+$", re.MULTILINE)


def _library_module(op: str) -> str | None:
    """The installed module whose ``Library.define`` made ``op``, from the dispatcher's
    record of where it was registered (the model's own file is not installed: None)."""
    import torch
    try:
        dump = torch._C._dispatch_dump(op)
    except RuntimeError:  # not registered in this process
        return None
    found = _REGISTERED_AT.search(dump)
    return importable_name(found.group(1)) if found else None


def importable_name(path: str) -> str | None:
    """``path``'s dotted module name when it is a module of an installed package
    (``transformers.models.llama.modeling_llama``), else None: the user's own file,
    loaded by path (a folder of theirs on sys.path here, the current one say, need not
    be on the device's)."""
    file = Path(path).resolve()
    parts, folder = [file.stem], file.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    if len(parts) == 1 or folder not in _installed_roots():
        return None
    name = ".".join(parts)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = spec and spec.origin
    return name if origin and Path(origin).resolve() == file else None


def _installed_roots() -> set[Path]:
    """Where installed packages live: the site folders, and PYTHONPATH's absolute
    folders (as the device tool and many containers install them)."""
    folders = [*site.getsitepackages(), site.getusersitepackages(),
               *(sysconfig.get_paths()[key] for key in ("purelib", "platlib")),
               *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                 if os.path.isabs(p))]
    return {Path(f).resolve() for f in folders if f}
