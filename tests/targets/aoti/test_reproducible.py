"""Reproducible bytes: the same spec gives the same artifact bytes,
whatever --out is, with a cold or a warm Inductor cache (one cache directory path; the
manifest's build.nondeterminism says the path is embedded).

The cause found: oneDNN's serialized descriptor of a prepacked weight carries 4 bytes of
uninitialised struct padding after two enum fields, and Inductor compiles that blob into
the library (targets/reproducible.py). Each process has other stack garbage there."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, _record

_SERIALIZE = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from targets.reproducible import canonical_md
out = {"raw": [], "canonical": []}
for cin, cout, k, s in [(64, 128, 1, 2), (16, 64, 3, 1), (3, 16, 7, 2), (64, 16, 1, 1)]:
    w = torch.ops.mkldnn._reorder_convolution_weight(
        torch.randn(cout, cin, k, k), [k // 2] * 2, [s] * 2, [1, 1], 1, [1, cin, 32, 32])
    w = w if w.is_mkldnn else w.to_mkldnn()
    blob = torch.ops.mkldnn._get_mkldnn_serialized_md(w)
    out["raw"].append(blob.tolist())
    out["canonical"].append(canonical_md(blob).tolist())
print(json.dumps(out))
"""


def test_prepacked_weight_descriptors_are_canonical_across_processes():
    import torch
    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN in this torch")
    runs = [json.loads(subprocess.run([sys.executable, "-c", _SERIALIZE, str(ROOT)],
                                      capture_output=True, text=True, check=True).stdout)
            for _ in range(3)]
    assert len({json.dumps(r["canonical"]) for r in runs}) == 1


@pytest.mark.slow
def test_real_cnn_rebuilds_are_byte_identical_cold_and_warm(tmp_path):
    """A Hugging Face ResNet (bottleneck blocks, 1x1 stride-2 shortcuts: prepacked oneDNN
    weights) built for cpu three times, each in its own process: the first with an empty
    Inductor cache, into A/x, B/x and A/y."""
    cache = tmp_path / "inductor-cache"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    outs = [tmp_path / "A" / "x.artifact", tmp_path / "B" / "x.artifact",
            tmp_path / "A" / "y.artifact"]
    for out in outs:
        out.parent.mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "exporter", "build", "bench/coverage/vision.py:resnet",
               "--target", "cpu", "--out", str(out), "-q"]
        _record(cmd)
        result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env,
                                timeout=600)
        assert result.returncode == 0, result.stderr[-800:]
    digests = [__import__("hashlib").sha256(out.read_bytes()).hexdigest()[:16] for out in outs]
    assert len(set(digests)) == 1, digests
