"""The onnx target's own CPU kernels: an ONNX Runtime custom-op library, compiled at build
time and packed in the artifact, that runs a decoder's int8/int4 GEMVs and its decode
attention in place of ONNX Runtime's MatMulNBits and GroupQueryAttention.

- ``nbits_rows.c``: MatMulNBits (symmetric 8- and 4-bit blocks, int8 activations per block
  as MLAS's accuracy level 4), weights repacked at load, four rows interleaved; variants
  with the skip-RMSNorm before it and the SwiGLU after it folded in. ``nbits_tiles.h``: its
  inner tiles, one activation row (decode) or four at once (prefill: each weight load and
  4-bit unpacking shared by the four, 1.4-1.5x MLAS's GEMM at 128 rows).
- ``rows_attention.c``: GroupQueryAttention's decoder case, reading the cache in place.

x86-64 with AVX2 and FMA (issue 52 goal 3: 1.27x llama.cpp Q8_0 and 1.44x Q4_0 on 2
threads where ORT's own ops gave 1.02x / 1.10x); on a CPU with AVX-512 VNNI the library
decodes on ``nbits_vnni.h``'s tile instead, picked when a session registers it
(``ISA_ENV=avx2`` keeps the AVX2 tiles there). ``rewrite.py`` moves the graph's nodes to
the library's domain; the runtime registers the library on the session
(runtime/executors/ort_kernels.py) and refuses a CPU without the ISA.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from runtime.host import scratch
from runtime.host.hostinfo import cpu_flags

HERE = Path(__file__).resolve().parent
SOURCES = ("nbits_rows.c", "rows_attention.c")
HEADERS = ("rows_abi.h", "nbits_tiles.h", "nbits_vnni.h")
ISA_ENV = "EDGE_EXPORTER_ONNX_KERNELS_ISA"  # "avx2": the AVX2 tiles on any CPU
LIBRARY = "onnx_kernels.so"  # the artifact entry, beside model.onnx
PLATFORM = "linux-x86_64"  # what the library is compiled for
ISA = "avx2+fma"
CPU_FLAGS = ("avx2", "fma")  # /proc/cpuinfo flags the library's code needs
FLAGS = ("-O3", "-mavx2", "-mfma", "-fPIC", "-shared", "-std=gnu11")


@dataclass(frozen=True)
class Kernels:
    """What a build compiled: the library file and the record the manifest keeps."""

    library: Path
    nodes: dict[str, int]  # op type in our domain -> nodes that run on the library


def compiler() -> str | None:
    """The C compiler: ``CC`` where set, else cc or gcc (the toolchain AOTInductor's builds
    already need)."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def unusable(platform: str) -> str | None:
    """Why a build for ``platform`` on this machine keeps ONNX Runtime's ops (None: it can
    use ours). The build validates what it ships, so this CPU must run the library too."""
    if platform != PLATFORM:
        return f"the artifact is for {platform}, and they are {PLATFORM} code"
    have = cpu_flags()
    missing = [f for f in CPU_FLAGS if have is not None and f not in have]
    if have is None or missing:
        return ("this CPU lacks " + ", ".join(missing) if missing
                else "this machine's CPU features are unknown") + ", which the build's " \
            "validation would need to run them"
    if compiler() is None:
        return "no C compiler (cc, gcc or CC) was found to compile them"
    return None


def compile_library(out: Path, sources: Path = HERE) -> Path:
    """The library from ``sources``' files, at ``out``; compiled once per source text,
    compiler and flags (a user cache), copied from there."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler to build the onnx target's kernels")
    texts = b"".join((sources / name).read_bytes() for name in (*SOURCES, *HEADERS))
    key = hashlib.sha256(texts + "\0".join((cc, *FLAGS)).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cached = cache / "edge-exporter" / "onnx-kernels" / key / LIBRARY
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        with scratch.directory("onnx-kernels-") as tmp:
            partial = Path(tmp) / LIBRARY
            done = subprocess.run([cc, *FLAGS, *(str(sources / n) for n in SOURCES), "-o",
                                   str(partial)], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"{cc} could not compile the onnx target's kernels:\n"
                                   + done.stderr[-4000:])
            staged = cached.with_name(f".{LIBRARY}.{os.getpid()}")
            shutil.copyfile(partial, staged)
            staged.replace(cached)  # atomic: a concurrent build never reads half a file
    shutil.copyfile(cached, out)
    return out


def apply(path: Path, platform: str, sources: Path | None = None
          ) -> tuple[Kernels | None, str | None]:
    """The model at ``path`` rewritten onto our kernels (rewrite.py) and the library
    compiled beside it; None when no node is one they take. Where ``platform`` or this
    CPU cannot run them: None, the model untouched, and the one line the build says."""
    import onnx

    from targets.onnx.kernels.rewrite import rewrite

    model = onnx.load(str(path), load_external_data=False)
    nodes = rewrite(model)
    if not nodes:
        return None, None
    why = unusable(platform)
    if why is not None:
        return None, (f"onnx: {sum(nodes.values())} node(s) keep ONNX Runtime's own "
                      f"MatMulNBits/GroupQueryAttention, not the target's AVX2 kernels: {why}")
    onnx.save(model, str(path))
    return Kernels(compile_library(path.parent / LIBRARY, sources or HERE), nodes), None
