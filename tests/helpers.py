"""Checks shared by the per-target test files."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import runtime
from exporter.model.zoo import ZOO


def triton_device() -> str:
    """Where a test runs Triton kernels: the GPU, or the CPU under ``TRITON_INTERPRET=1``
    with Triton installed; else the test is skipped."""
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton"):
        return "cpu"
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1 with Triton installed")


def assert_zoo_artifact_matches_eager(out: Path, name: str, batches=(1, 32)) -> None:
    """Load the built zoo model and compare it with eager at the ends of its batch range."""
    module, args, _ = ZOO[name]()
    program = runtime.load(out)
    for batch in batches:
        grown = tuple(a[:1].repeat(batch, *([1] * (a.dim() - 1))) for a in args)
        got = torch.utils._pytree.tree_leaves(program(*grown))
        expected = torch.utils._pytree.tree_leaves(module(*grown))
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


ROOT = Path(__file__).resolve().parent.parent
# A process like a device without torch: any `import torch` fails.
BLOCK_TORCH = textwrap.dedent("""
    import sys
    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name.split('.')[0] == 'torch':
                raise ImportError('No module named torch (blocked by the test)')
    sys.meta_path.insert(0, _NoTorch())
""")


def run_without_torch(ran, code: str, *args: str) -> subprocess.CompletedProcess:
    return ran(subprocess.run, [sys.executable, "-c", BLOCK_TORCH + textwrap.dedent(code),
                                *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def assert_runs_on_numpy_without_torch(ran, artifact: Path, x: np.ndarray, folder: Path) -> None:
    """``program(x)`` and ``program.run`` in a process without torch give numpy arrays equal
    to what the artifact gives with torch (a one-input, one-output artifact)."""
    np.save(folder / "x.npy", x)
    expected = runtime.load(artifact)(torch.from_numpy(x)).numpy()
    done = run_without_torch(ran, """
        import json, sys
        import numpy as np
        import runtime
        x = np.load(sys.argv[1])
        program = runtime.load(sys.argv[2])
        called, (named,) = program(x), program.run({program.input_names[0]: x}).values()
        assert type(called) is np.ndarray and type(named) is np.ndarray
        np.save(sys.argv[3], called)
        print(json.dumps({"same": bool((called == named).all()), "class": type(program).__name__,
                          "torch": sorted(m for m in sys.modules if m.startswith('torch'))}))
    """, str(folder / "x.npy"), str(artifact), str(folder / "y.npy"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"same": True, "class": "ArrayProgram", "torch": []}
    np.testing.assert_allclose(np.load(folder / "y.npy"), expected, rtol=1e-6, atol=1e-6)
