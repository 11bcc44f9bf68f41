"""The untuned TVM CPU schedules (targets/tvm/schedule.py, targets/tvm/tiling.py) on
shapes that do not tile evenly: each contraction must be taken by TiledContraction,
and the compiled function must still compute what torch computes."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

tvm = pytest.importorskip("tvm")
from tvm import relax  # noqa: E402
from tvm.relax.frontend.torch import from_exported_program  # noqa: E402

from targets.tvm.compile import parse_target, run_transform_params  # noqa: E402
from targets.tvm.schedule import default_rules, lower_pipeline, schedule  # noqa: E402


class Linear(nn.Module):  # 7 rows (prime: no row tile), 40 columns (no column tile)
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(33, 40)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Conv(nn.Module):  # stride 2 with padding; 5 output channels, a 9-wide output row
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(5)

    def forward(self, x):
        return self.bn(self.conv(x))


class BatchMatmul(nn.Module):
    def forward(self, a, b):
        return a @ b


CASES = {
    "linear": (Linear, (torch.randn(7, 33),)),
    "conv": (Conv, (torch.randn(2, 3, 17, 17),)),
    "batch-matmul": (BatchMatmul, (torch.randn(3, 12, 20), torch.randn(3, 20, 48))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_contraction_is_tiled_and_matches_torch(case):
    torch.manual_seed(0)
    make, args = CASES[case]
    module = make().eval()
    mod = from_exported_program(torch.export.export(module, args), keep_params_as_input=True)
    mod, params = relax.frontend.detach_params(mod)
    target = parse_target("llvm")
    counts: Counter = Counter()
    scheduled = schedule(mod, target, default_rules(counts))
    assert counts["TiledContraction"] == 1, counts
    executable = tvm.compile(scheduled, target=target, relax_pipeline=lower_pipeline(target))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    weights = run_transform_params(executable, scheduled, list(params.get("main", [])))
    out = vm["main"](*[tvm.runtime.tensor(a.numpy()) for a in args], *weights)
    got = torch.from_dlpack(out if hasattr(out, "shape") else out[0])
    with torch.no_grad():
        torch.testing.assert_close(got, module(*args), rtol=1e-4, atol=1e-4)
