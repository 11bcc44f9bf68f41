"""The aarch64 toolchain (native/cmake/aarch64-linux-gnu.cmake) links the native runtime's
libraries for arm64 and the result runs under qemu-user (tests/native/qemu.py)."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.native import qemu

pytestmark = qemu.needs_qemu
SMOKE = Path(__file__).parent / "cross_smoke"


@pytest.fixture(scope="module")
def smoke_build(tmp_path_factory) -> Path:
    build = tmp_path_factory.mktemp("cross-smoke")
    qemu.cmake_build(SMOKE, build)
    return build


def test_a_program_on_minizip_libsodium_and_json_cross_builds_and_runs_under_qemu(
        smoke_build, tmp_path):
    program = smoke_build / "xsmoke"
    header = subprocess.run([f"{qemu.TRIPLE}-readelf", "-h", str(program)],
                            capture_output=True, text=True, check=True).stdout
    assert "AArch64" in header
    archive = tmp_path / "two.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("a.txt", "a")
        z.writestr("b.txt", "b")
    ran = qemu.run(program, str(archive))
    assert ran.returncode == 0, ran.stderr
    said = json.loads(ran.stdout)
    assert said["zip_opened"] and said["entries"] == 2
    assert said["sha0"] == 0xba  # SHA-256("abc") starts with ba


def test_the_toolchain_links_only_arm64_libraries(smoke_build):
    link = (smoke_build / "CMakeFiles" / "xsmoke.dir" / "link.txt").read_text()
    assert "x86_64-linux-gnu" not in link
    assert f"/usr/lib/{qemu.TRIPLE}/libminizip" in link and "aarch64-linux-gnu-g++" in link


def test_qemu_commands_put_the_bundle_libraries_before_the_multiarch_folder(tmp_path):
    line = qemu.command("bin/edge-run", "--help", lib_dirs=[tmp_path / "lib"])
    assert line[:5] == ["qemu-aarch64", "-cpu", "cortex-a72", "-L", str(qemu.SYSROOT)]
    env = line[line.index("-E") + 1]
    assert env == f"LD_LIBRARY_PATH={tmp_path / 'lib'}:{qemu.MULTIARCH}"


def test_qemu_guests_run_single_threaded_since_qemu_7_2_hangs_in_thread_pools():
    line = qemu.command("bin/edge-run", "--help")
    guest_env = {line[i + 1] for i, word in enumerate(line) if word == "-E"}
    assert {"EDGE_THREADS=1", "TVM_NUM_THREADS=1"} <= guest_env
