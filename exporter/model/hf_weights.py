"""An ``hf:`` model built by transformers from the user's config, with or without the
folder's safetensors weights; whatever transformers raises on the user's files is a
SpecError (exit 2) naming the file, never an internal error.

Weights whose shapes contradict the config (a ``config.json`` edited after saving, a shard
from another model) are loaded with ``ignore_mismatched_sizes`` so that transformers lists
them all, then refused by name: transformers' own error only says "look at the above
report", a report the build keeps quiet.
"""

from __future__ import annotations

import json
from pathlib import Path

from exporter.errors import SpecError
from exporter.model.hf_limits import first_lines

INDEX = "model.safetensors.index.json"


def from_checkpoint(auto_class, config, path: Path, text: str, trust_remote_code: bool):
    """``(model, loading info)`` with the folder's weights; shapes checked."""
    try:
        model, info = auto_class.from_pretrained(
            path, config=config, local_files_only=True, use_safetensors=True,
            output_loading_info=True, ignore_mismatched_sizes=True,
            trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - transformers and safetensors on the user's files
        raise _load_error(exc, path, text) from None
    mismatched = sorted(info.get("mismatched_keys") or [])
    if mismatched:
        shown = "; ".join(f"{key} is {list(saved)} in {_file_of(path, key)}, the config makes "
                          f"it {list(wanted)}" for key, saved, wanted in mismatched[:4])
        more = f" and {len(mismatched) - 4} more" if len(mismatched) > 4 else ""
        raise SpecError(f"{len(mismatched)} weight(s) in {path} do not have the shape "
                        f"config.json gives them: {shown}{more}", where=text,
                        hint="config.json and the weights come from different models: save "
                             "both again with save_pretrained()")
    return model, info


def from_config(auto_class, config, text: str, trust_remote_code: bool):
    """The model with random weights; a config transformers cannot build is the user's."""
    try:
        return auto_class.from_config(config, trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - transformers' code on the user's config
        raise SpecError(f"transformers' {auto_class.__name__} cannot build a model from "
                        f"config.json ({type(exc).__name__}: {first_lines(exc)})", where=text,
                        hint="check config.json's sizes and model_type, and --task against "
                             "its architectures") from None


def check_index(index: Path, text: str) -> None:
    """A sharded checkpoint's weight_map names files in its own folder, nothing else."""
    try:
        shards = set(json.loads(index.read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SpecError(f"{index.name} is not a safetensors index ({type(exc).__name__})",
                        where=str(index), hint="write it with save_pretrained()") from None
    outside = sorted(s for s in shards if not isinstance(s, str) or "/" in s or "\\" in s
                     or s in ("", ".", "..") or not s.endswith(".safetensors"))
    if outside:
        raise SpecError(f"{index.name} maps weights to files outside its folder or not "
                        f"safetensors: {', '.join(map(str, outside[:4]))}", where=text,
                        hint="every shard must be a .safetensors file beside the index")
    missing = sorted(s for s in shards if not (index.parent / s).is_file())
    if missing:
        raise SpecError(f"{index.name} names {len(missing)} shard(s) that are not in "
                        f"{index.parent}: {', '.join(missing[:4])}", where=str(index),
                        hint="copy the whole checkpoint folder")


def _load_error(exc: Exception, path: Path, text: str) -> SpecError:
    from safetensors import SafetensorError  # a transformers dependency
    if isinstance(exc, SafetensorError) or "safetensors" in type(exc).__module__:
        return SpecError(f"the weights in {path} cannot be read: a safetensors file is "
                         f"damaged or incomplete ({first_lines(exc)})",
                         where=str(path / _weights_file(path)),
                         hint="copy or save the checkpoint again (save_pretrained)")
    return SpecError(f"transformers cannot load the weights in {path} "
                     f"({type(exc).__name__}: {first_lines(exc)})", where=text,
                     hint="check --task against the checkpoint's architectures, and that "
                          "config.json belongs to these weights (save both with "
                          "save_pretrained())")


def _weights_file(path: Path) -> str:
    return INDEX if (path / INDEX).is_file() else "model.safetensors"


def _file_of(path: Path, key: str) -> str:
    """The shard that holds ``key`` (the model's name for it may add or drop a prefix such
    as ``bert.``)."""
    if not (path / INDEX).is_file():
        return "model.safetensors"
    weight_map = json.loads((path / INDEX).read_text())["weight_map"]
    for name, shard in weight_map.items():
        if name == key or key.endswith("." + name) or name.endswith("." + key):
            return shard
    return INDEX
