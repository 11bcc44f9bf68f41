"""``exporter package --native ARTIFACT... --out bundle.tar.gz [--platform P]``: a bundle
that runs without Python.

    NAME/bin/edge-run           the native runner (native/), built for the platform with
                                the backends the artifacts use (exporter/ship/native_runner.py)
    NAME/lib/*.so*              the libraries it loads and nothing else: the backends' wheel
                                libraries it links, the ExecuTorch kernel libraries the
                                programs call, and what those need, except the device's C
                                and C++ runtime (exporter/ship/native_libs.py)
    NAME/artifacts/*.artifact   the artifacts, verified before they are packed
    NAME/run.sh                 checks SHA256SUMS and the artifact's pinned SHA-256, then
                                bin/edge-run ARTIFACT --inputs in.npz --out out.npz
    NAME/README.txt, SHA256SUMS

Only artifacts whose every partition has a native backend are packed; the others are
refused naming their partitions and the targets that can go native.
"""

from __future__ import annotations

import re
from pathlib import Path

import runtime
from exporter.errors import UserInputError
from exporter.kinds import PLAIN, kind_name_of
from exporter.ship.bundle import strings
from exporter.ship.native_libs import library_closure
from exporter.ship.native_runner import BACKENDS, RUNNER, build_runner, installed_runner
from exporter.ship.native_scripts import native_run_script
from exporter.ship.tarball import Members, add_sums, sha256, write_tar
from runtime.executors import holds_native_code
from runtime.format.manifest import Manifest
from runtime.host.outfiles import checked_output
from runtime.host.platforms import get_platform, host_platform, unknown_platform

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
# ExecuTorch kernel libraries the executorch backend opens for a program's kernels
# (native/src/backends/executorch_support.cc): q/dq ops, and every other non-primitive op.
_ET_QUANTIZED = "libexecutorch_kernels_quantized.so"
_ET_OPTIMIZED = "libexecutorch_kernels_optimized.so"
# the aten ops libexecutorch.so registers itself (beside every executorch_prim:: op)
_ET_PRIMITIVES = {"aten::sym_size.int", "aten::sym_numel", "aten::_local_scalar_dense"}


def package_native(artifacts: list[Path], out: Path, platform: str | None = None) -> dict:
    """Check the artifacts, build the runner, then write the bundle whole or not at all."""
    platform = platform or host_platform()
    if unknown_platform(platform):
        raise UserInputError(unknown_platform(platform), where="--platform")
    folder = _bundle_name(artifacts, out)
    manifests = [runtime.read_manifest(path) for path in artifacts]  # hashes checked
    backends = _native_backends(artifacts, manifests, platform)
    runner = build_runner(platform, frozenset(backends))
    libraries = library_closure(runner, platform, _kernel_libraries(runner, manifests))
    members: Members = {f"bin/{RUNNER}": installed_runner(runner)}
    members.update({f"lib/{name}": path for name, path in sorted(libraries.items())})
    members.update({f"artifacts/{p.name}": p for p in artifacts})
    digests = {member: sha256(data) for member, data in members.items()}
    pins = {p.name: digests[f"artifacts/{p.name}"] for p in artifacts}
    arch = get_platform(platform).arch
    members["run.sh"] = native_run_script(pins, arch).encode()
    members["README.txt"] = _readme(folder, artifacts, platform, sorted(libraries)).encode()
    add_sums(members, digests)
    write_tar(out, folder, members, executable=_executable)
    size = sum(len(d) if isinstance(d, bytes) else d.stat().st_size for d in members.values())
    return {"bundle": str(out), "folder": folder, "platform": platform, "native": True,
            "artifacts": [p.name for p in artifacts], "backends": sorted(backends),
            "libraries": sorted(libraries), "installed_bytes": size}


def _bundle_name(artifacts: list[Path], out: Path) -> str:
    if not artifacts:
        raise UserInputError("no artifacts to package", hint="exporter package --native "
                             "A.artifact [B.artifact...] --out bundle.tar.gz")
    if not out.name.endswith((".tar.gz", ".tgz")):
        raise UserInputError("the bundle must be a .tar.gz file", where=str(out))
    checked_output(out, reads=artifacts)
    name = out.name.removesuffix(".tar.gz").removesuffix(".tgz")
    for what, text in [("the bundle's folder name (from --out)", name),
                       *(("an artifact's file name", p.name) for p in artifacts)]:
        if not _SAFE_NAME.fullmatch(text) or len(text) > 200:
            raise UserInputError(f"{what} {text!r} is not a plain file name: the bundle uses "
                                 "it in tar paths, SHA256SUMS and run.sh",
                                 hint="use letters, digits, '.', '_', '+' and '-' (not first)")
    names = [p.name for p in artifacts]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UserInputError(f"two artifacts share the name {repeated[0]}",
                             hint="rename one: the bundle keeps artifacts by file name")
    return name


def _native_backends(artifacts: list[Path], manifests: list[Manifest], platform: str
                     ) -> set[str]:
    """The backends the runner needs; UserInputError naming every partition, artifact kind
    or platform the native runner cannot take."""
    problems = []
    for path, manifest in zip(artifacts, manifests):
        if kind_name_of(manifest) != PLAIN:
            problems.append(f"{path.name}: a {kind_name_of(manifest)} artifact; the native "
                            "runner runs plain artifacts (generation needs the Python runtime)")
        problems += [f"{path.name}: partition '{p.name}' runs on {p.backend}"
                     for p in manifest.partitions if p.backend not in BACKENDS]
        built_for = manifest.requirements.platform_name
        native = [p.name for p in manifest.partitions if holds_native_code(p)]
        if native and built_for != platform:
            problems.append(f"{path.name}: partition(s) {', '.join(native)} hold native code "
                            f"for {built_for}, not {platform}")
    if problems:
        raise UserInputError(
            f"the native runner for {platform} cannot run these artifacts as they are",
            details=problems,
            hint="build for a target that goes native (" + ", ".join(sorted(BACKENDS)) +
                 f") with --platform {platform} and --fallback forbid (no torch fallback "
                 "partitions), or package without --native for the Python runtime")
    return {p.backend for m in manifests for p in m.partitions}


def _kernel_libraries(runner: Path, manifests: list[Manifest]) -> tuple[Path, ...]:
    """The ExecuTorch kernel libraries the programs call, from the wheel the runner linked."""
    kernels = {k for m in manifests for p in m.partitions if p.backend == "executorch"
               for k in strings(p.meta.get("kernels"))}
    wanted = set()
    if any(k.startswith("quantized_decomposed::") for k in kernels):
        wanted.add(_ET_QUANTIZED)
    if any(not k.startswith(("quantized_decomposed::", "executorch_prim::"))
           and k not in _ET_PRIMITIVES for k in kernels):
        wanted.add(_ET_OPTIMIZED)
    if not wanted:
        return ()
    folder = _cache_value(runner.parent / "CMakeCache.txt", "EDGE_EXECUTORCH_LIBRARY_DIR")
    return tuple(Path(folder) / name for name in sorted(wanted))


def _cache_value(cache: Path, key: str) -> str:
    for line in cache.read_text(errors="replace").splitlines():
        if line.startswith(f"{key}:"):
            return line.split("=", 1)[1]
    raise UserInputError(f"the runner's build has no {key}", where=str(cache),
                         hint="remove build/native/ and package again")


def _executable(member: str) -> bool:
    return member.endswith(".sh") or member.startswith("bin/")


def _readme(name: str, artifacts: list[Path], platform: str, libraries: list[str]) -> str:
    first = artifacts[0].name
    return (f"{name}: edge-exporter artifacts and the native runner (no Python)\n\n"
            + "".join(f"  artifacts/{p.name}\n" for p in artifacts)
            + f"\nFor {platform}: bin/{RUNNER} and lib/ ({', '.join(libraries)}).\n"
            "The device needs only its C and C++ runtime (glibc, libstdc++).\n\n"
            f"  tar xzf {name}.tar.gz && cd {name}\n"
            f"  ./run.sh {first} --inputs in.npz --out out.npz\n\n"
            "in.npz holds one array per input name; out.npz gets one per output.\n"
            "run.sh first checks every file against SHA256SUMS (and the artifact against the\n"
            "SHA-256 it pins) and refuses to go on if one differs. --public-key KEY.pub\n"
            "checks the artifact's signature as well.\n")
