"""Target tvm for another platform: the LLVM target it compiles for, and the settings it
refuses at the start (they mean something on the build machine only)."""

from __future__ import annotations

import pytest

from targets.errors import TargetOptionError
from targets.tvm import cross

pytest.importorskip("tvm")


def test_a_comma_list_of_llvm_attributes_reaches_tvm_as_a_list():
    from targets.tvm.compile import parse_target
    target = parse_target("llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+v8.2a")
    assert list(target.attrs["mattr"]) == ["+neon", "+v8.2a"]
    assert target.attrs["mtriple"] == "aarch64-linux-gnu"


def test_the_aarch64_default_target_is_one_tvm_accepts():
    from targets.tvm.compile import parse_target
    target = parse_target(cross.cross_platform("linux-aarch64").target)
    assert "+neon" in list(target.attrs["mattr"])


def test_a_missing_cross_compiler_is_a_usage_error_naming_make_native_deps(monkeypatch):
    monkeypatch.setattr(cross.shutil, "which", lambda _name: None)
    with pytest.raises(TargetOptionError) as caught:
        cross.cross_compiler("linux-aarch64")
    assert caught.value.exit_code == 2
    assert "make native-deps" in caught.value.hint and "aarch64-linux-gnu-g++" in str(caught.value)


@pytest.mark.parametrize("settings, flag", [
    (dict(cpu_isa="avx2", tune=0, tvm_target=None), "--cpu-isa"),
    (dict(cpu_isa="auto", tune=8, tvm_target=None), "--tune"),
    (dict(cpu_isa="auto", tune=0, tvm_target="llvm -mcpu=znver4"), "--tvm-target"),
])
def test_host_only_settings_are_refused_for_a_cross_build(settings, flag):
    with pytest.raises(TargetOptionError) as caught:
        cross.check_cross_options("linux-aarch64", **settings)
    assert caught.value.where == flag


def test_a_platform_tvm_cannot_cross_compile_for_is_refused():
    with pytest.raises(TargetOptionError, match="cannot cross-compile"):
        cross.cross_platform("linux-riscv64")
