"""bench/llm/ort_int8_paths.py: each int8/int4 path it times is the onnx target's own
quantize step (or the u8u8 op it names) and computes the float products it stands for."""

from __future__ import annotations

import numpy as np
import onnx

from bench.llm import ort_int8_paths as paths

CONFIG = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16}


def test_projections_are_a_layers_packed_matmuls():
    assert paths.projections(CONFIG) == [(64, 128), (64, 64), (64, 192), (96, 64)]


def test_every_path_matches_the_float_products_and_runs_in_turns(tmp_path):
    shapes = paths.projections(CONFIG)
    models = paths.path_models(shapes, 2, tmp_path, [32])
    assert set(models) == {"int8-weight-b32", "int4-weight-b32", "int8-dynamic", "u8u8"}
    rng = np.random.default_rng(0)
    feeds = {f"x{k}": rng.standard_normal((1, k)).astype(np.float32) for k in (64, 96)}
    want = paths.session(tmp_path / "float.onnx", 1).run(None, feeds)
    sessions = {name: paths.session(p, 1) for name, p in models.items()}
    db = {name: paths.sqnr_db(s.run(None, feeds), want) for name, s in sessions.items()}
    # 8-bit weights ~40 dB, 7-bit weights with per-tensor activations less, 4-bit ~20
    assert db["int8-weight-b32"] > 35 and db["u8u8"] > 33
    assert db["int8-dynamic"] > 28 and 14 < db["int4-weight-b32"] < db["int8-dynamic"]
    ops = {name: {n.op_type for n in onnx.load(str(p), load_external_data=False).graph.node}
           for name, p in models.items()}
    assert ops["int8-weight-b32"] == {"MatMulNBits"} and ops["u8u8"] == {"DynamicQuantizeMatMul"}
    times = paths.measure(sessions, feeds, rounds=3, threads=1)
    assert all(len(t) == 3 and min(t) >= 0 for t in times.values())
