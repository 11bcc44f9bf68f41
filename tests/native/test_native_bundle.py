"""A native bundle's runner is the installed one: stripped, its RPATH `$ORIGIN/../lib`, so
the unpacked folder runs anywhere it is copied, with no LD_LIBRARY_PATH and no build tree;
every library it loads (and what those load) comes from the bundle's lib/ or is the
device's C and C++ runtime."""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

from exporter.ship.native_libs import is_device_runtime
from tests.native.conftest import dynamic_paths, is_stripped, run_native

# ld.so's listing: "libz.so.1 => /path/libz.so.1 (0x...)"
_LOADED = re.compile(r"^\s*(\S+) => (\S+) \(0x[0-9a-f]+\)", re.MULTILINE)


@pytest.fixture(scope="module")
def copied_bundle(native_mlp, tmp_path_factory) -> Path:
    """zoo:mlp on tvm packed for this machine, unpacked, then copied elsewhere."""
    from exporter.ship.native_bundle import package_native
    where = tmp_path_factory.mktemp("native-bundle")
    package_native([native_mlp], where / "device.tar.gz")
    with tarfile.open(where / "device.tar.gz") as tar:
        tar.extractall(where / "unpacked", filter="tar")
    folder = shutil.copytree(where / "unpacked" / "device", where / "moved" / "device")
    shutil.rmtree(where / "unpacked")
    return folder


def test_the_bundled_runner_is_stripped_with_rpath_origin_lib(copied_bundle, edge_run):
    runner = copied_bundle / "bin" / "edge-run"
    assert dynamic_paths(runner) == {"RPATH": "$ORIGIN/../lib"}
    assert is_stripped(runner) and not is_stripped(edge_run)
    assert str(edge_run.parent) not in runner.read_bytes().decode("latin-1")


def test_a_copied_bundle_loads_every_library_from_its_own_lib_folder(copied_bundle):
    """The tvm runner's libtvm_runtime finds libtvm_ffi only beside it, minizip its libz:
    all from lib/ (RPATH reaches what libraries load too), none from the build machine."""
    listing = subprocess.run([str(copied_bundle / "bin" / "edge-run")],
                             env={"LD_TRACE_LOADED_OBJECTS": "1"}, capture_output=True,
                             text=True, timeout=60, check=True).stdout
    loaded = dict(_LOADED.findall(listing))
    assert {"libtvm_runtime.so", "libtvm_ffi.so", "libminizip.so.1", "libz.so.1"} <= set(loaded)
    outside = {name: path for name, path in loaded.items() if not is_device_runtime(name)
               and Path(path).parent.resolve() != (copied_bundle / "lib").resolve()}
    assert not outside
    assert {p.name for p in (copied_bundle / "lib").iterdir()} == {
        name for name in loaded if not is_device_runtime(name)}


def test_the_bundle_reads_zips_without_shipping_openssl_or_other_codecs(copied_bundle):
    """The zip reader needs zlib only: no crypto library (several MiB) and no bzip2 or xz,
    whose compression methods an artifact's reader refuses anyway."""
    shipped = {p.name for p in (copied_bundle / "lib").iterdir()}
    assert not {n for n in shipped if n.startswith(("libcrypto", "libssl", "libbz2", "liblzma",
                                                    "libzstd", "libzip.", "libgnutls"))}


def test_a_copied_bundle_runs_with_no_library_path_as_the_build_tree_runner(
        copied_bundle, edge_run, native_mlp, mlp_inputs, tmp_path):
    bundled, tree = tmp_path / "bundled.npz", tmp_path / "tree.npz"
    done = subprocess.run([str(copied_bundle / "bin" / "edge-run"),
                           f"artifacts/{native_mlp.name}", "--inputs", str(mlp_inputs),
                           "--out", str(bundled)], cwd=copied_bundle, env={},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert run_native(edge_run, native_mlp, mlp_inputs, tree).returncode == 0
    with np.load(bundled) as got, np.load(tree) as want:
        assert got.files == want.files
        assert all(np.array_equal(got[name], want[name]) for name in want.files)
