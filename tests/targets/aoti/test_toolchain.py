"""The compiler probe: a CXX that links libstdc++ statically is caught and replaced."""

from __future__ import annotations

import shutil

import pytest

from targets import toolchain

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("readelf") is None,
                                reason="needs g++ and readelf")


@pytest.fixture
def static_cxx(tmp_path):
    wrapper = tmp_path / "static-g++"
    # What the GPU machine's CXX does: every shared library gets its own libstdc++.
    wrapper.write_text('#!/bin/sh\nexec g++ "$@" -static-libstdc++ -static-libgcc\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_probe_tells_static_from_dynamic(static_cxx):
    assert toolchain.links_libstdcxx_dynamically("g++") is True
    assert toolchain.links_libstdcxx_dynamically(static_cxx) is False
    assert toolchain.links_libstdcxx_dynamically("/no/such/compiler") is None


def test_static_cxx_is_replaced_and_said(static_cxx, monkeypatch):
    monkeypatch.setenv("CXX", static_cxx)
    toolchain.choose_cxx.cache_clear()
    try:
        choice = toolchain.choose_cxx()
    finally:
        toolchain.choose_cxx.cache_clear()
    assert choice.switched and choice.compiler and choice.compiler != static_cxx
    assert "statically" in choice.note and static_cxx in choice.note


def test_no_good_compiler_names_what_to_set(static_cxx, monkeypatch):
    monkeypatch.setenv("CXX", static_cxx)
    monkeypatch.setattr(toolchain, "FALLBACK_COMPILERS", ())
    toolchain.choose_cxx.cache_clear()
    try:
        choice = toolchain.choose_cxx()
    finally:
        toolchain.choose_cxx.cache_clear()
    assert choice.compiler is None and "CXX=/usr/bin/g++" in choice.note


def test_a_build_compiles_no_precompiled_header_for_its_one_library(tmp_path):
    """A precompiled header costs two header compiles per set of flags, more than it
    saves on the one library a build compiles (docs/design-notes.md): the first
    `make demo` spent most of its AOTInductor time there."""
    from targets import get_target
    from targets.base import LowerOptions
    for name in ("cpu", "cuda"):
        configs = get_target(name).inductor_configs(LowerOptions(tmp_path))
        assert configs["aot_inductor.precompile_headers"] is False


@pytest.mark.skipif(shutil.which("ccache") is None or shutil.which("timeout") is None,
                    reason="needs ccache and coreutils' timeout")
def test_a_second_compile_of_the_same_source_is_a_ccache_hit(tmp_path, monkeypatch):
    import subprocess
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CCACHE_DIR", str(tmp_path / "ccache"))
    compiler = toolchain.compiler_stand_in(shutil.which("g++"), 60)
    assert compiler.endswith("/g++")  # Inductor tells gcc from clang by the name
    source = tmp_path / "kernel.cpp"
    source.write_text('extern "C" int kernel(int x) { return 2 * x; }\n')
    for out in ("a.o", "b.o"):
        subprocess.run([compiler, "-O2", "-c", str(source), "-o", str(tmp_path / out)],
                       check=True, timeout=60)
    stats = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True,
                           check=True).stdout
    counts = dict(line.split("\t")[:2] for line in stats.splitlines() if "\t" in line)
    assert (counts.get("direct_cache_hit"), counts.get("cache_miss")) == ("1", "1")
    assert (tmp_path / "a.o").read_bytes() == (tmp_path / "b.o").read_bytes()


def test_ccache_disable_compiles_without_the_cache(tmp_path, monkeypatch):
    import subprocess
    if shutil.which("ccache") is None:
        pytest.skip("needs ccache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CCACHE_DIR", str(tmp_path / "ccache"))
    monkeypatch.setenv("CCACHE_DISABLE", "1")
    source = tmp_path / "kernel.cpp"
    source.write_text('extern "C" int kernel(int x) { return 2 * x; }\n')
    subprocess.run([toolchain.compiler_stand_in(shutil.which("g++"), 60), "-c", str(source), "-o",
                    str(tmp_path / "a.o")], check=True, timeout=60)
    assert (tmp_path / "a.o").is_file() and not (tmp_path / "ccache").exists()
