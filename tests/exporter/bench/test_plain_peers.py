"""bench/compare_targets.py's AOTInductor peer, compiled and loaded for real (slow)."""

from __future__ import annotations

import pytest
import torch

from bench import compare_targets


@pytest.mark.slow
def test_the_aoti_peer_loads_without_aoti_load_package_and_matches_eager(tmp_path,
                                                                         monkeypatch):
    """torch's Python loader compiles CPU-ISA probe programs before loading (most of a
    minute on a fresh machine, inside every timing step); the peer skips it and still
    runs the package's library on the model's inputs."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU()).eval()
    args = (torch.randn(2, 8),)
    path = tmp_path / "peer.pt2"
    compare_targets.plain_aoti(module, args, {}, path)  # compiles (and loads) once

    def probed(*_, **__):
        raise AssertionError("aoti_load_package was called")
    monkeypatch.setattr(torch._inductor, "aoti_load_package", probed)
    call = compare_targets.plain_aoti(module, args, {}, path)  # the file exists: load only
    with torch.no_grad():
        torch.testing.assert_close(call(), module(*args))
