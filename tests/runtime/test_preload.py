"""What the validation process imports first (exporter/builder/preload.py): a custom
op's defining code, by module name when it belongs to an installed package, as a path
when it is the user's own file."""

from __future__ import annotations

from types import SimpleNamespace

import transformers.models.llama.modeling_llama as modeling_llama

from exporter.builder.preload import importable_name, preload_for
from runtime.__main__ import preload
from runtime.format.manifest import Partition


def _fallback_with(op: str) -> SimpleNamespace:
    part = Partition(name="p0", backend="torch", device="cpu", files=(), inputs=("x",),
                     outputs=("y",), meta={"custom_ops": [op]})
    return SimpleNamespace(partitions=[part])


def test_a_model_file_of_an_installed_package_is_preloaded_by_module_name():
    """A package's file imported alone fails on its relative imports (Llama's on the
    GPU machine: "attempted relative import with no known parent package")."""
    sources = preload_for(_fallback_with("somelib.unknown_op"), modeling_llama.__file__)
    assert sources == ["transformers.models.llama.modeling_llama"]
    preload(sources)  # as `python -m runtime ... --preload` does: it imports


def test_the_users_own_file_stays_a_path(tmp_path):
    package = tmp_path / "mine"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text("X = 1\n")
    (tmp_path / "alone.py").write_text("X = 1\n")
    for file in (package / "model.py", tmp_path / "alone.py"):
        assert importable_name(str(file)) is None
        assert preload_for(_fallback_with("somelib.op"), str(file)) == [str(file)]
