"""A CPU AOTInductor library reads its constants from 64-byte aligned memory
(runtime/executors/aoti.py, aligned_cpu_runner): its own load leaves them 16-byte aligned,
and oneDNN's packed weights read across cache lines."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.executors.aoti import aligned_cpu_runner


class _PackedOps(torch.nn.Module):
    """A convolution and a linear, both packed for oneDNN by Inductor's freezing."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3)
        self.linear = torch.nn.Linear(16 * 6 * 6, 32)

    def forward(self, x):
        return self.linear(torch.relu(self.conv(x)).flatten(1))


@pytest.fixture(scope="module")
def packed_package(tmp_path_factory):
    torch.manual_seed(0)
    model, x = _PackedOps().eval(), torch.randn(4, 3, 8, 8)
    path = tmp_path_factory.mktemp("aoti-constants") / "model.pt2"
    with torch.no_grad():
        torch._inductor.aoti_compile_and_package(
            torch.export.export(model, (x,)), package_path=str(path),
            inductor_configs={"freezing": True})
    return path, model, x


def test_the_librarys_constants_are_aligned_and_its_outputs_unchanged(packed_package,
                                                                      tmp_path):
    path, model, x = packed_package
    ours = aligned_cpu_runner(path, tmp_path / "ours")
    assert ours is not None
    read = ours.runner.extract_constants_map(False)  # what the library reads now
    layouts = {t.layout for t in read.values()}
    assert torch._mkldnn in layouts, "no oneDNN-packed constant: the case is not covered"
    for name, tensor in read.items():
        if tensor.layout == torch.strided:
            assert tensor.data_ptr() % 64 == 0, name
    loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
    with torch.no_grad():
        assert torch.equal(ours.run([x])[0], loader.run([x])[0])
        torch.testing.assert_close(ours.run([x])[0], model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("as_loaded", [False, True])
def test_the_partitions_meta_says_whether_constants_are_copied_or_read_as_loaded(
        packed_package, as_loaded):
    from runtime.executors.aoti import AotiExecutor, AotiMeta, _Runner
    from runtime.format.manifest import Partition

    path, model, x = packed_package
    partition = Partition(name="p0", backend="aoti", device="cpu", files=(path.name,),
                          inputs=("x",), outputs=("y",), meta={})
    meta = AotiMeta(package=path.name, constants_as_loaded=as_loaded or None)
    executor = AotiExecutor.load(partition, meta, path.parent, where="test")
    runner = executor._run.__self__
    assert isinstance(runner, _Runner) != as_loaded
    assert as_loaded or runner.constants, "aligned: the library reads our copies"
    with torch.no_grad():
        torch.testing.assert_close(executor([x])[0], model(x), rtol=1e-4, atol=1e-4)


def test_a_package_that_is_not_one_library_is_left_to_the_package_loader(tmp_path):
    import zipfile

    empty = tmp_path / "empty.pt2"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("empty/data/aotinductor/model/notes.txt", "no library")
    assert aligned_cpu_runner(empty, tmp_path / "out") is None


def test_a_library_without_onednn_constants_runs_as_loaded(mlp_build, tmp_path):
    """zoo:mlp's cpu library (the suite's shared build: MKL's linears, nothing packed for
    oneDNN) runs with the constants it loaded, as the package loader runs it."""
    import zipfile

    from exporter.model.zoo import ZOO

    with zipfile.ZipFile(mlp_build.artifact) as archive:
        (member,) = [m for m in archive.namelist() if m.endswith(".pt2")]
        path = Path(archive.extract(member, tmp_path))
    ours = aligned_cpu_runner(path, tmp_path / "ours")
    assert ours is not None and ours.constants == {}  # nothing copied
    read = ours.runner.extract_constants_map(False)
    assert read and torch._mkldnn not in {t.layout for t in read.values()}
    model, (x,), _ = ZOO["mlp"]()
    loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
    with torch.no_grad():
        assert torch.equal(ours.run([x])[0], loader.run([x])[0])
        torch.testing.assert_close(ours.run([x])[0], model(x), rtol=1e-4, atol=1e-5)
