"""bench/library_kernels.py: the kernels a built artifact's libraries load and a copy's
call, read from stand-in packages (zips holding a wrapper's source)."""

from __future__ import annotations

import io
import json
import zipfile

from bench.library_kernels import difference, library_kernels, main

# the GPU wrapper's guard on an input, a clone only where it is misaligned: not a copy
PLAIN = '''
    attention_join_kernel_gdc = loadKernel("/tmp/k/c1.cubin", "attention_join_kernel_gdc", 0);
    triton_poi_fused_0 = loadKernel(kernels_path, "triton_poi_fused_0", 128, this->cubin_dir_);
    if ((reinterpret_cast<std::uintptr_t>(arg2_1.data_ptr()) & (16 -1)) != 0) {
        AtenTensorHandle arg2_1_aligned;
        aoti_torch_clone_preserve_strides(arg2_1, &arg2_1_aligned);
    }
'''
STORED = '''
    attention_store_kernel_gdc = loadKernel("/tmp/k/c2.cubin", "attention_store_kernel_gdc", 0);
    triton_poi_fused_0 = loadKernel(kernels_path, "triton_poi_fused_0", 128, this->cubin_dir_);
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_copy_(buf3, arg2_1, 0));
'''


def _artifact(root, name, source):
    """An artifact's zip as the writer stores it: the package an uncompressed entry."""
    package = io.BytesIO()
    with zipfile.ZipFile(package, "w") as archive:
        archive.writestr("model/data/aotinductor/model/wrapper.cpp", source)
        archive.writestr("model/data/aotinductor/model/wrapper.so", b"\0")
    path = root / f"{name}.artifact"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as artifact:
        artifact.writestr("manifest.json", "{}")
        artifact.writestr("partitions/p0/model.pt2", package.getvalue())
    return path


def test_kernels_copies_and_their_difference(tmp_path, capsys):
    a, b = _artifact(tmp_path, "a", PLAIN), _artifact(tmp_path, "b", STORED)
    listed = library_kernels(a)
    assert listed == {"partitions/p0/model.pt2": {
        "kernels": ["attention_join_kernel_gdc", "triton_poi_fused_0"], "copies": 0}}
    assert difference(listed, library_kernels(b)) == {"partitions/p0/model.pt2": {
        "only_first": ["attention_join_kernel_gdc"],
        "only_second": ["attention_store_kernel_gdc"], "copies_added": 1}}
    assert difference(listed, listed) == {}
    assert main([str(a), str(b)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 3 and "difference" in lines[2]


def test_a_missing_artifact_or_a_folder_is_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "none")]) == 2
    assert main([str(tmp_path)]) == 2
    assert "library_kernels.py" in capsys.readouterr().err
