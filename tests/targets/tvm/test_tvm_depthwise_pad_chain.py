"""A pad after a convolution, in the convolution's TVM function (tests/models/
depthwise_pad_chain.py, MobileNetV1's first depthwise step): the tiled schedule computed
the pad per tile of the convolution, so its border, which depends on no tile, was never
written, and the next convolution read whatever the memory held (6.0 after ReLU6 where
eager had 0-0.17, or 1e34: mobilenet_v1/v2, efficientnet and mobilenetv2_deeplabv3 of
the coverage suite on tvm; fresh memory is zeros, so a build could pass by luck). Such
an epilogue now runs whole after the tiles (targets/tvm/tiling.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

tvm = pytest.importorskip("tvm")
from tvm import relax, tirx  # noqa: E402
from tvm.relax.frontend.torch import from_exported_program  # noqa: E402

from targets.tvm.compile import parse_target  # noqa: E402
from targets.tvm.schedule import default_rules, schedule  # noqa: E402
from tests.models import depthwise_pad_chain  # noqa: E402


def test_a_pad_after_a_tiled_convolution_writes_its_border():
    model, args = depthwise_pad_chain.factory()
    mod = from_exported_program(torch.export.export(model, args), keep_params_as_input=True)
    mod, _ = relax.frontend.detach_params(mod)
    target = parse_target("llvm")
    counts: Counter = Counter()
    scheduled = schedule(mod, target, default_rules(counts))
    (func,) = [f for gv, f in scheduled.functions_items()
               if isinstance(f, tirx.PrimFunc) and gv.name_hint.endswith("_pad")]
    assert counts["TiledContraction"] == 2  # both convolutions, the padded one included
    library = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                          target=target)
    rng = np.random.default_rng(0)
    shapes = [[int(d) for d in p.shape] for p in func.params]
    arrays = [tvm.runtime.tensor(rng.standard_normal(s).astype("float32")) for s in shapes[:-1]]
    out = tvm.runtime.tensor(np.full(shapes[-1], np.nan, dtype="float32"))  # the pool's garbage
    library["main"](*arrays, out)
    padded = out.numpy()
    assert padded.shape[-2:] == (17, 17)
    assert not np.isnan(padded).any(), "cells of the pad's output never written"
    assert (padded[..., 16, :] == 0).all() and (padded[..., :, 16] == 0).all()
