"""TVM's import of a partition (targets/tvm/compile.py): a program the tvm target's passes
already decomposed with torch.export's default table is imported as it is, into the Relax
module the importer's own decomposition gives; any other program is decomposed first."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tvm")
from tvm.ir import assert_structural_equal  # noqa: E402
from tvm.relax.frontend.torch import from_exported_program  # noqa: E402

from targets.tvm.compile import _decomposed_once  # noqa: E402


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        return torch.nn.functional.gelu(self.norm(self.proj(x))).reshape(x.shape[0], 2, 4)


def _program():
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=16)  # its sizes read through sym_size
    return torch.export.export(_Block().eval(), (torch.randn(2, 8),),
                               dynamic_shapes=({0: batch},))


def test_a_decomposed_program_is_imported_without_tracing_it_again():
    decomposed = _program().run_decompositions()
    assert _decomposed_once(decomposed) == {"run_ep_decomposition": False}
    assert_structural_equal(
        from_exported_program(decomposed, keep_params_as_input=True,
                              run_ep_decomposition=False),
        from_exported_program(decomposed, keep_params_as_input=True), map_free_vars=True)


def test_a_fresh_capture_is_decomposed_by_the_importer():
    assert _decomposed_once(_program()) == {"run_ep_decomposition": True}  # TRAINING dialect
