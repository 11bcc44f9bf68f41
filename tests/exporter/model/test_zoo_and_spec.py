"""The model zoo (each model exports with a dynamic batch and runs at batch 1 and 32) and
load_spec (file, module and zoo specs; every user mistake is a SpecError with a hint)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from exporter.errors import SpecError
from exporter.model.spec import ModelSpec, load_spec
from exporter.model.zoo import ZOO, describe

INPUT_NAMES = {"mlp": ["x"], "cnn": ["image"], "encoder": ["input_ids", "attention_mask"],
               "decoder": ["input_ids"]}


def _at_batch(args: tuple, batch: int) -> tuple:
    """The example args repeated/cut to ``batch`` rows (ids stay valid ids)."""
    return tuple(a[:1].expand(batch, *a.shape[1:]).contiguous() for a in args)


# ---------------------------------------------------------------------------- zoo


@pytest.fixture(scope="module", params=sorted(ZOO))
def exported(request):
    module, args, dynamic_shapes = ZOO[request.param]()
    program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    return request.param, module, args, program


def test_zoo_exports_with_dynamic_batch(exported):
    name, _, _, program = exported
    ranges = [(r.lower, r.upper) for r in program.range_constraints.values()]
    assert ranges == [(1, 32)], f"{name}: batch must stay dynamic over 1..32, got {ranges}"
    user_inputs = [s.arg.name for s in program.graph_signature.input_specs
                   if s.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    assert user_inputs == INPUT_NAMES[name]


@pytest.mark.parametrize("batch", [1, 32])
def test_zoo_runs_at_batch_bounds(exported, batch):
    name, module, args, program = exported
    inputs = _at_batch(args, batch)
    with torch.no_grad():
        eager = module(*inputs)
        captured = program.module()(*inputs)
    eager_leaves = torch.utils._pytree.tree_leaves(eager)
    captured_leaves = torch.utils._pytree.tree_leaves(captured)
    assert len(eager_leaves) == len(captured_leaves)
    for e, c in zip(eager_leaves, captured_leaves):
        assert e.shape[0] == batch
        torch.testing.assert_close(c, e, rtol=1e-4, atol=1e-5)


def test_zoo_output_shapes():
    module, args, _ = ZOO["encoder"]()
    out = module(*args)
    assert set(out) == {"last_hidden_state", "pooled"}  # nested outputs: a dict
    assert out["last_hidden_state"].shape == (2, 16, 64) and out["pooled"].shape == (2, 64)
    module, args, _ = ZOO["decoder"]()
    assert module(*args).shape == (2, 16, 256)
    assert args[0].dtype == torch.int64


def test_decoder_is_causal():
    module, (ids,), _ = ZOO["decoder"]()
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 256
    with torch.no_grad():
        a, b = module(ids), module(changed)
    torch.testing.assert_close(a[:, :-1], b[:, :-1])  # the future does not leak back


def test_zoo_is_deterministic_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    first, args1, _ = ZOO["cnn"]()
    second, args2, _ = ZOO["cnn"]()
    assert torch.equal(torch.rand(3), expected)
    for (k, v), (_, w) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(v, w), k
    assert torch.equal(args1[0], args2[0])
    assert not first.training


def test_describe_covers_the_zoo():
    assert list(describe()) == list(ZOO)
    assert all(isinstance(d, str) and d and "\n" not in d for d in describe().values())


# ---------------------------------------------------------------------------- load_spec: success


def _write(tmp_path: Path, body: str, name: str = "model.py") -> Path:
    path = tmp_path / name
    path.write_text("import torch\nfrom torch import nn\n\n" + textwrap.dedent(body))
    return path


GOOD = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


def make():
    return Net(), torch.randn(2, 4)


def make_dynamic():
    return Net(), (torch.randn(2, 4),), ({0: torch.export.Dim("batch", max=8)},)
"""


def test_zoo_spec():
    spec = load_spec("zoo:mlp")
    assert isinstance(spec, ModelSpec) and spec.source == "zoo:mlp"
    assert not spec.module.training and spec.kwargs == {}
    assert spec.args[0].shape == (2, 64)
    assert spec.origin_file.endswith("zoo.py")


def test_file_spec_wraps_a_single_tensor(tmp_path):
    path = _write(tmp_path, GOOD)
    before = list(sys.path)
    spec = load_spec(f"{path}:make")
    assert sys.path == before  # the file's folder was on sys.path only while loading
    assert isinstance(spec.args, tuple) and spec.args[0].shape == (2, 4)
    assert spec.dynamic_shapes is None and spec.origin_file == str(path)
    assert not spec.module.training


def test_file_spec_with_dynamic_shapes_exports(tmp_path):
    spec = load_spec(f"{_write(tmp_path, GOOD)}:make_dynamic")
    program = torch.export.export(spec.module, spec.args, dynamic_shapes=spec.dynamic_shapes)
    # torch 2.13: a Dim without min reports the range [0, max]
    assert [(r.lower, r.upper) for r in program.range_constraints.values()] == [(0, 8)]


def test_file_spec_imports_its_siblings(tmp_path):
    _write(tmp_path, "def width():\n    return 3\n", name="helpers_for_spec_test.py")
    path = _write(tmp_path, """
        import helpers_for_spec_test

        def make():
            return nn.Linear(helpers_for_spec_test.width(), 1), (torch.randn(2, 3),)
    """)
    assert load_spec(f"{path}:make").module.in_features == 3


def test_a_factory_of_random_weights_gives_the_same_model_each_load(tmp_path):
    """`exporter validate` rebuilds the spec: a factory that draws its weights (the
    README's my_model.py) must give the weights the build had, not fail validation."""
    path = _write(tmp_path, GOOD)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    first, second = load_spec(f"{path}:make"), load_spec(f"{path}:make")
    assert torch.equal(torch.rand(3), expected)  # the caller's RNG is untouched
    assert torch.equal(first.module.fc.weight, second.module.fc.weight)
    assert torch.equal(first.args[0], second.args[0])


def test_each_load_is_a_fresh_module(tmp_path):
    path = _write(tmp_path, "def make():\n    return nn.Linear(4, 1), (torch.randn(2, 4),)\n")
    first = load_spec(f"{path}:make")
    path.write_text(path.read_text().replace("nn.Linear(4, 1)", "nn.Linear(4, 5)"))
    assert first.module.out_features == 1
    assert load_spec(f"{path}:make").module.out_features == 5


def test_module_spec(tmp_path, monkeypatch):
    package = tmp_path / "spec_test_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    _write(package, GOOD, name="models.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = load_spec("spec_test_pkg.models:make_dynamic")
    assert spec.origin_file == str(package / "models.py")
    assert spec.dynamic_shapes is not None and spec.args[0].shape == (2, 4)


def test_module_spec_finds_the_working_directory(tmp_path, monkeypatch):
    _write(tmp_path, GOOD, name="cwd_spec_models.py")
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    assert load_spec("cwd_spec_models:make").args[0].shape == (2, 4)
    assert sys.path == before
    sys.modules.pop("cwd_spec_models", None)


# ---------------------------------------------------------------------------- load_spec: errors


def _spec_error(spec: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    err = info.value
    assert err.exit_code == 2 and err.hint, str(err)
    assert "Traceback" not in str(err)
    return err


@pytest.mark.parametrize("spec", ["", "   "])
def test_empty_spec(spec):
    assert "empty" in str(_spec_error(spec))


@pytest.mark.parametrize("spec", ["model.py", "model.py:", ":make"])
def test_spec_without_a_name(spec):
    err = _spec_error(spec)
    assert "FILE.py:NAME, package.module:NAME, zoo:NAME or hf:PATH" in err.hint


def test_missing_file(tmp_path):
    err = _spec_error(f"{tmp_path}/nope.py:make")
    assert "does not exist" in str(err) and "nope.py" in err.where


def test_directory_is_not_a_file(tmp_path):
    (tmp_path / "pkg.py").mkdir()
    assert "is not a file" in str(_spec_error(f"{tmp_path}/pkg.py:make"))


def test_unknown_module():
    err = _spec_error("no_such_package_xyz.models:make")
    assert "no Python module named 'no_such_package_xyz.models'" in str(err)


def test_zoo_unknown_lists_the_zoo():
    err = _spec_error("zoo:resnet9000")
    assert "resnet9000" in str(err)
    assert all(f"zoo:{name}" in err.hint for name in ZOO)


def test_import_failure_points_at_user_line(tmp_path):
    path = _write(tmp_path, "X = 1\nY = X / 0\n")
    err = _spec_error(f"{path}:make")
    assert "ZeroDivisionError: division by zero" in str(err)
    assert f"{path}:5" in err.where and "Y = X / 0" in err.where
    assert not any(name.startswith("_exporter_spec_model") and
                   getattr(mod, "__file__", None) == str(path)
                   for name, mod in list(sys.modules.items()))


def test_import_of_missing_dependency_names_the_user_line(tmp_path):
    path = _write(tmp_path, "import not_installed_pkg_xyz\n")
    err = _spec_error(f"{path}:make")
    assert "ModuleNotFoundError" in str(err) and f"{path}:4" in err.where


def test_syntax_error_points_at_user_line(tmp_path):
    path = _write(tmp_path, "def make(:\n    pass\n")
    err = _spec_error(f"{path}:make")
    assert "SyntaxError" in str(err) and f"{path}:4" in err.where


def test_missing_name_lists_the_functions(tmp_path):
    path = _write(tmp_path, GOOD)
    err = _spec_error(f"{path}:build_model")
    assert "'build_model'" in str(err)
    assert "make, make_dynamic" in err.hint  # its own functions, not imported ones like torch


def test_name_is_not_callable(tmp_path):
    path = _write(tmp_path, "MODEL = 3\n")
    assert "not a callable" in str(_spec_error(f"{path}:MODEL"))


def test_factory_raises_points_at_user_line(tmp_path):
    path = _write(tmp_path, "def make():\n    raise ValueError('weights missing')\n")
    err = _spec_error(f"{path}:make")
    assert "ValueError: weights missing" in str(err)
    assert f"{path}:5 in make" in err.where


@pytest.mark.parametrize("body, expected", [
    ("return nn.Linear(4, 1)", "returned a Linear; expected (module, example_args)"),
    ("return (nn.Linear(4, 1), (1,), {}, None, 4)", "returned a tuple of 5"),
    ("return (nn.Linear(4, 1), (1,), None, 4)", "returned dynamic_shapes of type int"),
    ("return 'model'", "returned a str"),
])
def test_factory_returns_the_wrong_shape(tmp_path, body, expected):
    path = _write(tmp_path, f"def make():\n    {body}\n")
    assert expected in str(_spec_error(f"{path}:make"))


def test_first_element_not_a_module(tmp_path):
    path = _write(tmp_path, "def make():\n    return nn.Linear, (torch.randn(2, 4),)\n")
    err = _spec_error(f"{path}:make")
    assert "not a torch.nn.Module" in str(err) and "instance" in err.hint


@pytest.mark.parametrize("args, expected", [
    ("{'x': torch.randn(2, 4)}", "keyword args go third"),
    ("'text'", "example args of type str"),
])
def test_example_args_of_the_wrong_type(tmp_path, args, expected):
    path = _write(tmp_path, f"def make():\n    return nn.Linear(4, 1), {args}\n")
    err = _spec_error(f"{path}:make")
    assert expected in str(err)


def test_example_args_with_a_non_tensor_leaf(tmp_path):
    path = _write(tmp_path, """
        import numpy as np

        def make():
            return nn.Linear(4, 1), (torch.randn(2, 4), {"mask": np.ones(3)})
    """)
    err = _spec_error(f"{path}:make")
    assert "example_args[1]['mask'] of type ndarray" in str(err)
    assert "torch.as_tensor" in err.hint


def test_dynamic_shapes_of_the_wrong_type(tmp_path):
    path = _write(tmp_path, "def make():\n    return nn.Linear(4, 1), (torch.randn(2, 4),), 0\n")
    assert "dynamic_shapes of type int" in str(_spec_error(f"{path}:make"))
