"""AOTInductor's kernel launcher, made to start the decode kernels (``*_gdc``,
triton_kernels.py) as programmatic dependent launches while the cuda target compiles.

NOT USED, and removed in the next commit: kept in history for the next attempt
(bench/RESULTS.md, session 60). Its rewritten launcher compiled into a torch 2.11 library
on the H200; the kernels could not wait inside AOTInductor (torch's kernel analysis takes
Triton's impure wait instruction as writing every argument).

A batch-1 decode step is a chain of short dependent kernels; each one's launch, and the
first loads of its weights, wait for the one before to drain completely, about 2 us a
kernel of a step's 0.9 ms (docs/design-notes.md). Launched with programmatic stream
serialization (Hopper and later), a ``_gdc`` kernel's programs start while the kernel
before finishes, load their weights, and wait (``griddepcontrol.wait``) only before they
read what that kernel wrote. AOTInductor launches every kernel with a plain
``cuLaunchKernel`` and offers no setting for it, so ``dependent_launches()`` rewrites
the launcher it writes into the library (``kernel_driver``): ``loadKernel`` notes the
functions named ``*_gdc`` and ``launchKernel`` starts those with ``cuLaunchKernelEx`` and
the attribute, on a device of compute capability 9 or later; every other kernel as before.
Where the torch in use writes its launcher differently, nothing is changed (``applied``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import torch

SUFFIX = "_gdc"
_LOAD = re.compile(r"static inline CUfunction loadKernel\(")
_LAUNCH = re.compile(r"static inline void launchKernel\(")

# after the original helpers, renamed ...Plain: the same calls, by the same names
_HELPERS = r"""
struct EdgeGdcFunctions { CUfunction items[64]; int count; };
static inline EdgeGdcFunctions& edgeGdcFunctions() {
    static EdgeGdcFunctions found = {};
    return found;
}
static inline bool edgeGdcDevice() {
    static int capable = -1;
    if (capable < 0) {
        CUdevice device;
        int major = 0;
        capable = cuCtxGetDevice(&device) == CUDA_SUCCESS &&
            cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                 device) == CUDA_SUCCESS && major >= 9;
    }
    return capable == 1;
}
template <typename Source, typename... Rest>
static inline CUfunction loadKernel(Source source, const std::string& funcName,
                                    Rest... rest) {
    CUfunction func = loadKernelPlain(source, funcName, rest...);
    const std::string suffix = "SUFFIX";
    EdgeGdcFunctions& found = edgeGdcFunctions();
    if (funcName.size() > suffix.size() &&
            funcName.compare(funcName.size() - suffix.size(), suffix.size(), suffix) == 0 &&
            found.count < 64 && edgeGdcDevice()) {
        found.items[found.count++] = func;
    }
    return func;
}
static inline bool edgeGdcFunction(CUfunction func) {
    const EdgeGdcFunctions& found = edgeGdcFunctions();
    for (int i = 0; i < found.count; ++i) {
        if (found.items[i] == func) return true;
    }
    return false;
}
static inline void edgeGdcLaunch(CUfunction func, uint32_t gridX, uint32_t gridY,
                                 uint32_t gridZ, uint32_t numWarps,
                                 uint32_t sharedMemBytes, void* args[],
                                 cudaStream_t stream) {
    CUlaunchAttribute attribute = {};
    attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attribute.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig config = {};
    config.gridDimX = gridX;
    config.gridDimY = gridY;
    config.gridDimZ = gridZ;
    config.blockDimX = 32 * numWarps;
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = sharedMemBytes;
    config.hStream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    CUDA_DRIVER_CHECK(cuLaunchKernelEx(&config, func, args, nullptr));
}
template <typename... Rest>
static inline void launchKernel(CUfunction func, Rest... rest) {
    if (edgeGdcFunction(func)) {
        edgeGdcLaunch(func, rest...);
    } else {
        launchKernelPlain(func, rest...);
    }
}
""".replace("SUFFIX", SUFFIX)


def with_dependent_launches(driver: str) -> str | None:
    """The launcher source ``driver`` (AOTInductor's ``kernel_driver()``) with the ``_gdc``
    kernels started as dependent launches, or None where it is not laid out as expected."""
    if len(_LOAD.findall(driver)) < 1 or len(_LAUNCH.findall(driver)) != 1:
        return None
    renamed = _LOAD.sub("static inline CUfunction loadKernelPlain(", driver)
    renamed = _LAUNCH.sub("static inline void launchKernelPlain(", renamed)
    return renamed + _HELPERS


@contextlib.contextmanager
def dependent_launches() -> Iterator[bool]:
    """While compiling: the libraries' launchers start ``_gdc`` kernels as dependent
    launches; yields whether this torch's launcher could be rewritten."""
    try:
        from torch._inductor.codegen.cuda.device_op_overrides import CUDADeviceOpOverrides
    except ImportError:
        yield False
        return
    original = CUDADeviceOpOverrides.kernel_driver
    if torch.version.hip is not None or with_dependent_launches(original(
            CUDADeviceOpOverrides())) is None:
        yield False
        return

    def kernel_driver(self) -> str:
        source = original(self)
        return with_dependent_launches(source) or source

    CUDADeviceOpOverrides.kernel_driver = kernel_driver
    try:
        yield True
    finally:
        CUDADeviceOpOverrides.kernel_driver = original
