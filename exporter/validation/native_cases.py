"""Validation of a cross-built artifact (``exporter build --platform`` for another
platform): the native runner built for that platform (exporter/ship/native_runner.py), run
under qemu-user here, one ``edge-run`` per case.

``python -m exporter.validation.native_cases ARTIFACT --cases IN --out OUT`` keeps the
contract of ``python -m runtime run-cases`` (inputs ``{case}/{input}``, outputs
``{case}/{output}``, ``--stage-out``, the refusal's own exit code), so
exporter/validation/validate.py judges its outputs the same way.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from runtime.__main__ import Stage
from runtime.executors import holds_native_code
from runtime.format.manifest import Manifest
from runtime.host.platforms import get_platform, host_platform
from runtime.host.tensorio import load_tensors, save_tensors

COMMAND = (__name__,)  # python -m runs this module
NATIVE_BACKENDS = frozenset({"executorch", "tvm"})  # exporter/ship/native_runner.py's
# Thread pools (TVM's, ExecuTorch's) never finish a run under qemu-user 7.2 here
GUEST_ENV = {"TVM_NUM_THREADS": "1", "EDGE_THREADS": "1"}
# qemu's default `max` CPU makes XNNPACK's int8 kernels compute wrong results
GUEST_CPU = {"aarch64": "cortex-a72"}


def why_not(manifest: Manifest) -> str | None:
    """Why this machine cannot run a cross-built artifact's native code under qemu-user;
    None when it can (the platform's qemu and sysroot are here, every backend is native)."""
    platform = get_platform(manifest.requirements.platform_name)
    others = sorted({p.backend for p in manifest.all_partitions()} - NATIVE_BACKENDS)
    if others:
        return f"the native runner has no {', '.join(others)} backend"
    if shutil.which(f"qemu-{platform.arch}") is None:
        return f"qemu-{platform.arch} is not installed (Debian: qemu-user; `make native-deps`)"
    if not Path(f"/usr/{platform.gnu_triple}/lib").is_dir():
        return f"no {platform.arch} sysroot in /usr/{platform.gnu_triple} (`make native-deps`)"
    return None


def command_for(manifest: Manifest) -> tuple[str, ...] | None:
    """The validation process for this artifact: None for the Python runtime here, or
    this module's when its native code is another platform's."""
    cross = manifest.requirements.platform_name != host_platform()
    native = any(holds_native_code(p) for p in manifest.all_partitions())
    return COMMAND if cross and native else None


def guest_command(platform: str, runner: Path, *args: str) -> list[str]:
    """qemu-user with the cross toolchain's sysroot (loader, libstdc++) and the platform's
    multiarch folder (libzip, libsodium); the runner finds the backends' libraries itself."""
    spec = get_platform(platform)
    env = [f"LD_LIBRARY_PATH=/usr/lib/{spec.gnu_triple}",
           *(f"{k}={v}" for k, v in GUEST_ENV.items())]
    cpu = ["-cpu", GUEST_CPU[spec.arch]] if spec.arch in GUEST_CPU else []
    return [f"qemu-{spec.arch}", *cpu, "-L", f"/usr/{spec.gnu_triple}",
            *(word for pair in env for word in ("-E", pair)), str(runner), *args]


def run_cases(artifact: str, cases_path: str, out_path: str, stage: Stage) -> int:
    from exporter.ship.native_runner import build_runner  # cmake; only a cross validation needs it
    stage("reading the manifest")
    manifest = _manifest(artifact)
    platform = manifest.requirements.platform_name
    stage(f"building the native runner for {platform}")
    backends = frozenset(p.backend for p in manifest.all_partitions())
    runner = build_runner(platform, backends)
    grouped: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in load_tensors(cases_path).items():
        case, _, name = key.partition("/")
        grouped.setdefault(case, {})[name] = tensor
    results = {}
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    with tempfile.TemporaryDirectory(prefix="exporter-native-cases-") as tmp:
        for case, inputs in sorted(grouped.items()):
            stage(f"running case {case!r} in the {platform} runner under qemu")
            given, got = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
            np.savez(given, **{name: t.numpy() for name, t in inputs.items()})
            done = subprocess.run(guest_command(platform, runner, artifact, "--inputs",
                                                str(given), "--out", str(got)),
                                  env=env, capture_output=True, text=True)
            if done.returncode != 0:
                sys.stdout.write(done.stdout)
                sys.stderr.write(done.stderr)
                return done.returncode
            with np.load(got) as outputs:
                results.update({f"{case}/{name}": torch.from_numpy(outputs[name].copy())
                                for name in outputs.files})
    stage("writing the outputs")
    save_tensors(out_path, results)
    return 0


def _manifest(artifact: str) -> Manifest:
    from runtime.format.archive import ArtifactReader
    reader = ArtifactReader.open(artifact)  # the runner checks it again, as a device does
    try:
        return Manifest.from_dict(reader.manifest, where=artifact)
    finally:
        reader.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exporter.validation.native_cases")
    parser.add_argument("artifact")
    parser.add_argument("--cases", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--stage-out", help="rewrite the stage reached here as it goes")
    parser.add_argument("--preload", action="append", default=[])
    args = parser.parse_args(argv)
    return run_cases(args.artifact, args.cases, args.out, Stage(args.stage_out))


if __name__ == "__main__":
    sys.exit(main())
