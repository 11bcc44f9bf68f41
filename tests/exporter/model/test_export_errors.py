"""explain_export_failure: each kind of torch.export failure becomes one ExportFailedError
that names the user's file:line, the construct, the guard and what to try.

Each model is written to a file in tmp_path and loaded through load_spec, as a user's
would be; the test knows the line it expects the error to point at.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from torch.export import Dim

from exporter.errors import ExportFailedError
from exporter.model.export_errors import explain_export_failure
from exporter.model.spec import load_spec

HEADER = "import torch\nfrom torch import nn\n\n\n"


def _model_file(tmp_path: Path, forward_body: str, *, batch: int = 8,
                dynamic: bool = False, prelude: str = "") -> Path:
    """A spec file: Model.forward(x) runs ``forward_body``; make() returns its example."""
    dims = '({0: torch.export.Dim("batch", min=1, max=32)},)' if dynamic else "None"
    source = (HEADER + prelude + "class Model(nn.Module):\n    def forward(self, x):\n"
              + textwrap.indent(textwrap.dedent(forward_body), " " * 8)
              + f"\n\ndef make():\n    return Model(), (torch.randn({batch}, 4),), {dims}\n")
    path = tmp_path / "model.py"
    path.write_text(source)
    return path


def _line_of(path: Path, snippet: str) -> int:
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if snippet in line)


def _explain(path: Path) -> ExportFailedError:
    spec = load_spec(f"{path}:make")
    with pytest.raises(Exception) as info:
        torch.export.export(spec.module, spec.args, dynamic_shapes=spec.dynamic_shapes)
    return explain_export_failure(info.value, spec.origin_file)


def _assert_points_at(err: ExportFailedError, path: Path, snippet: str) -> None:
    text = str(err)
    assert f"{path}:{_line_of(path, snippet)}" in text, text
    assert snippet in text  # the source text of that line is quoted
    assert "Traceback" not in text


def test_data_dependent_control_flow(tmp_path):
    path = _model_file(tmp_path, """
        if x.sum() > 0:
            return x * 2
        return x - 1
    """)
    err = _explain(path)
    _assert_points_at(err, path, "if x.sum() > 0:")
    text = str(err)
    assert "data-dependent control flow" in text
    assert "Eq(u0, 1)" in text  # the guard torch could not decide
    assert "torch.cond" in err.hint
    assert err.details[0].startswith("torch said: GuardOnDataDependentSymNode")


def test_a_branch_in_installed_library_code_is_not_the_users_to_rewrite(tmp_path):
    """LED's `if is_global_attn:` is transformers' line: the hint says whose code it is,
    not to rewrite it with torch.cond."""
    package = tmp_path / "site-packages" / "somelib"
    package.mkdir(parents=True)
    path = _model_file(package, """
        if x.sum() > 0:
            return x * 2
        return x - 1
    """)
    err = _explain(path)
    assert "data-dependent control flow" in str(err)
    assert "somelib package's code" in err.hint and "torch.cond" not in err.hint


def test_branch_on_data_dependent_size_is_control_flow(tmp_path):
    path = _model_file(tmp_path, """
        idx = x.nonzero()
        if idx.shape[0] > 3:
            return idx.float().sum()
        return x.sum()
    """)
    err = _explain(path)
    _assert_points_at(err, path, "if idx.shape[0] > 3:")
    assert "u0 > 3" in str(err) and "torch.cond" in err.hint


def test_data_dependent_shape(tmp_path):
    path = _model_file(tmp_path, """
        idx = x.nonzero()
        return idx.view(2, -1)
    """)
    err = _explain(path)
    _assert_points_at(err, path, "return idx.view(2, -1)")
    assert "data-dependent shape" in str(err)
    assert "2*u0 < 2" in str(err)
    # torch's own suggested checks are passed on, with the _check_is_size advice
    assert "torch._check(2*idx.shape[0] >= 2)" in err.hint
    assert "torch._check_is_size" in err.hint


def test_dynamic_dim_split_by_view(tmp_path):
    path = _model_file(tmp_path, "return x.view(4, -1)", dynamic=True)
    err = _explain(path)
    _assert_points_at(err, path, "return x.view(4, -1)")
    text = str(err)
    assert "specializes dynamic dim batch" in text
    assert "x.size()[0]" in text  # L['x'] rendered as the input name
    assert "Dim('_batch', min=1, max=8)" in err.hint and "batch = 4*_batch" in err.hint
    assert "--dynamic" in err.hint
    assert err.details[0].startswith("torch said: UserError: Constraints violated (batch)")
    assert any("more violated guards" in d for d in err.details)  # long lists are cut


def test_dynamic_dim_fixed_by_shape_assert(tmp_path):
    path = _model_file(tmp_path, """
        assert x.shape[0] == 4
        return x + 1
    """, batch=4, dynamic=True)
    err = _explain(path)
    _assert_points_at(err, path, "assert x.shape[0] == 4")
    assert "only works when the dim is 4" in str(err)
    assert "batch = 4" in err.hint and "static" in err.hint


def test_op_without_meta_kernel(tmp_path):
    prelude = textwrap.dedent("""\
        @torch.library.custom_op("exporter_test::no_fake", mutates_args=())
        def no_fake(x: torch.Tensor) -> torch.Tensor:
            return x.clone()


    """)
    path = _model_file(tmp_path, "return no_fake(x) + 1", prelude=prelude)
    err = _explain(path)
    _assert_points_at(err, path, "return no_fake(x) + 1")
    assert "exporter_test::no_fake has no fake (meta) kernel" in str(err)
    assert 'register_fake("exporter_test::no_fake")' in err.hint


def test_aten_style_op_without_meta_kernel(tmp_path):
    prelude = textwrap.dedent("""\
        if not hasattr(torch.ops.exporter_test, "no_meta"):
            torch.library.define("exporter_test::no_meta", "(Tensor x) -> Tensor")
            torch.library.impl("exporter_test::no_meta", "cpu")(lambda x: x.clone())


    """)
    path = _model_file(tmp_path, "return torch.ops.exporter_test.no_meta(x)", prelude=prelude)
    err = _explain(path)
    _assert_points_at(err, path, "return torch.ops.exporter_test.no_meta(x)")
    assert "UnsupportedOperatorException" in err.details[0]
    assert 'register_fake("exporter_test::no_meta")' in err.hint


def test_untraceable_python_construct(tmp_path):
    path = _model_file(tmp_path, "return torch.from_numpy(x.numpy() * 2)")
    err = _explain(path)
    _assert_points_at(err, path, "return torch.from_numpy(x.numpy() * 2)")
    assert "cannot trace" in str(err) and "numpy" in err.hint
    assert ".numpy() is not supported" in err.details[0]


def test_generic_failure_keeps_torch_message(tmp_path):
    path = _model_file(tmp_path, "return x @ torch.ones(3, 3)")
    err = _explain(path)
    _assert_points_at(err, path, "return x @ torch.ones(3, 3)")
    assert "RuntimeError" in str(err)
    assert "same reduction dim" in err.details[0]
    assert "draft_export" in err.hint
    assert isinstance(err.__cause__, RuntimeError)  # the full torch error stays reachable
    assert err.exit_code == 3


def test_caller_frames_are_not_the_model():
    """The frame that called torch.export (here: this test) must never be blamed."""
    class Broken(torch.nn.Module):
        def forward(self, x):
            return x @ torch.ones(3, 3)

    with pytest.raises(RuntimeError) as info:
        torch.export.export(Broken(), (torch.randn(2, 4),))
    err = explain_export_failure(info.value, None)
    assert "return x @ torch.ones(3, 3)" in str(err)
    assert "torch.export.export(Broken()" not in str(err)


def test_location_from_truncated_message_form(tmp_path):
    """torch shortens paths in '(file.py:N in fn)'; trusted only when it is the origin file."""
    origin = tmp_path / "pkg" / "model.py"
    origin.parent.mkdir()
    origin.write_text("import torch\n\n\ndef forward(x):\n    return x.foo()\n")
    exc = RuntimeError("something failed\nCaused by: (kg/model.py:5 in forward)")
    err = explain_export_failure(exc, str(origin))
    assert f"{origin}:5 in forward: `return x.foo()`" in str(err)
    assert explain_export_failure(exc, None).where is None


def test_nothing_located_still_one_paragraph():
    err = explain_export_failure(ValueError("bad thing"), None)
    assert err.where is None
    assert "ValueError" in str(err) and "bad thing" in str(err)
    err = explain_export_failure(ValueError(""), "/nowhere/model.py")
    assert "no source line found" in err.where and "(no message)" in err.details[0]


def test_dim_named_when_no_line_is_known():
    """A constraint violation whose guard came from torch internals still names the dim."""
    exc = RuntimeError(
        "Constraints violated (batch)! For more information, run with TORCH_LOGS=\"+dynamic\".\n"
        "  - Not all values of batch = L['x'].size()[0] in the specified range batch <= 32 "
        "satisfy the generated guard L['x'].size()[0] != 4.\n"
        "Suggested fixes:\n  batch = Dim('batch', max=3)\n")
    err = explain_export_failure(exc, None)
    assert err.where.startswith("dynamic dim batch = x.size()[0]")
    assert "batch = Dim('batch', max=3)" in err.hint


def test_explained_error_is_a_toolchain_error_with_cause():
    cause = RuntimeError("x")
    err = explain_export_failure(cause, None)
    assert isinstance(err, ExportFailedError) and err.__cause__ is cause


@pytest.mark.parametrize("dim_min", [1, 2])
def test_export_accepts_dim_min_1_with_example_batch_2(dim_min):
    """Documents torch 2.13: min=1 is fine as long as the example batch is not 1."""
    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    ep = torch.export.export(Double(), (torch.randn(2, 4),),
                             dynamic_shapes=({0: Dim("b", min=dim_min, max=32)},))
    (low_high,) = [(r.lower, r.upper) for r in ep.range_constraints.values()]
    assert low_high == (dim_min, 32)
    with pytest.raises(Exception, match="specialized it to be a constant"):
        torch.export.export(Double(), (torch.randn(1, 4),),
                            dynamic_shapes=({0: Dim("b", min=dim_min, max=32)},))


def test_a_failure_in_the_exporters_own_code_is_not_blamed_on_the_model():
    """A generating step's attention (ours) that fails under tracing named the model's
    attention call and said "check that the model runs eagerly", which it did (an outside
    check on DeepSeek-V3). Now the paragraph names our frame and calls it our gap."""
    from runtime.generation.attention_op import grouped_attention

    class Model(torch.nn.Module):
        def forward(self, query, keys):
            return grouped_attention(query, keys, keys, keys, keys, None, 1.0, None)

    try:
        torch.export.export(Model(), (torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 6)),
                            strict=False)
    except Exception as exc:  # noqa: BLE001 - whatever torch raises
        error = explain_export_failure(exc, None)
    assert "exporter's own code" in str(error) and "attention_op.py" in str(error)
    assert "runs eagerly" not in str(error)


def test_a_loop_over_data_in_a_library_is_not_the_users_to_fix(tmp_path):
    """DBRX's experts loop over the experts a batch hit (transformers' code): a
    data-dependent loop, said as control flow in that package, without proposing
    torch._check in a file the user does not own."""
    transformers = pytest.importorskip("transformers")
    import exporter
    from exporter.errors import ExportFailedError
    config = transformers.DbrxConfig(
        d_model=32, n_heads=2, n_layers=1, max_seq_len=64, vocab_size=64,
        attn_config={"kv_n_heads": 1, "rope_theta": 10000.0, "clip_qkv": 8.0},
        ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 2, "moe_top_k": 1})
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(ExportFailedError) as info:
        exporter.build(model, task="text-generation", target="onnx", max_context=16,
                       out=tmp_path / "dbrx.artifact")
    err = info.value
    assert "data-dependent control flow" in str(err) and "modeling_dbrx.py" in str(err)
    assert "transformers package's code" in err.hint and "torch._check" not in err.hint


def test_factory_dynamic_batch_with_batch_one_examples_asks_for_size_two(tmp_path):
    """A factory that declares a dynamic batch but gives batch-1 examples: torch's own fix
    (`batch = 1`) would undo the request; the error asks for examples of size 2 instead."""
    path = _model_file(tmp_path, "return x + 1", batch=1, dynamic=True)
    err = _explain(path)
    assert "the example inputs have size 1 there" in str(err)
    assert "size 2 or more" in err.hint
    assert "batch = 1" not in err.hint and "static" not in err.hint


def test_a_guard_with_a_remainder_says_no_bounds_help(tmp_path):
    """XLNet's relative shift (a reshape after a slice) guards `(2*s - 1) % s != 0`, true
    for every s >= 2 but past torch's range analysis: narrowing the bounds, as the hint
    said, never helped."""
    path = _model_file(tmp_path, """
        b = x.shape[0]
        y = torch.zeros(1, b, 2 * b).reshape(1, 2 * b, b)[:, 1:, :]
        return y.reshape(1, b, 2 * b - 1) + x.sum()
    """, dynamic=True)
    err = _explain(path)
    assert "takes a remainder" in str(err) and "other bounds do not help" in err.hint
