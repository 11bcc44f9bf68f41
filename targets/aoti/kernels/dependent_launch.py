"""The decode kernels (``*_gdc``, triton_kernels.py) started as programmatic dependent
launches inside a built library, while the cuda target compiles (``dependent_launches()``).

A batch-1 decode step is a chain of short kernels, and each plain launch waits for the
kernel before to drain completely; a dependent launch starts early, loads its weights and
waits only before it reads what the kernel before wrote, so most of that drain is hidden.
Two things in torch stand between our kernels and that, and this module changes both,
only for the compile it wraps:

- AOTInductor starts every kernel with a plain ``cuLaunchKernel`` and has no setting for
  launch attributes. Its launcher source (``kernel_driver``) is rewritten: ``loadKernel``
  notes the functions whose names end in ``_gdc`` and ``launchKernel`` starts those with
  ``cuLaunchKernelEx`` and programmatic stream serialization, on a GPU of compute
  capability 9 or later and unless ``EDGE_EXPORTER_PLAIN_LAUNCHES`` is set (then, and for
  every other kernel, as before; a ``_gdc`` kernel started plainly waits for nothing).
- torch works out which arguments a user Triton kernel writes from its TTIR, and takes
  an impure inline-asm instruction (Triton's ``gdc_wait``) as writing every argument:
  AOTInductor then copied each weight before each call. A ``_gdc`` kernel declares what
  it writes (``declare_writes``), and the analysis answers that for it.

Where the torch in use lays either out differently, nothing is changed and the kernels
are traced in their plain form (``dependent_launches()`` yields False).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Iterator

import torch

SUFFIX = "_gdc"
PLAIN_ENV = "EDGE_EXPORTER_PLAIN_LAUNCHES"
_WRITES = "edge_exporter_writes"
_ANALYSES = ("identify_mutated_tensors", "identify_accessed_tensors")
_LOAD = re.compile(r"static inline CUfunction loadKernel\(")
_LAUNCH = re.compile(r"static inline void launchKernel\(")
_active = False  # inside dependent_launches(): the _gdc forms are traced
_traced = False  # and one was: the launcher of the library compiled now is rewritten

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
        capable = std::getenv("PLAIN_ENV") == nullptr &&
            cuCtxGetDevice(&device) == CUDA_SUCCESS &&
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
// a kernel the build chose by its code (targets/aoti/dependent_kernels.py)
template <typename... Rest>
static inline void launchKernelDependent(CUfunction func, Rest... rest) {
    if (edgeGdcDevice()) {
        edgeGdcLaunch(func, rest...);
    } else {
        launchKernelPlain(func, rest...);
    }
}
""".replace("SUFFIX", SUFFIX).replace("PLAIN_ENV", PLAIN_ENV)


def declare_writes(kernel, *arguments: str):
    """``kernel`` (a ``_gdc`` Triton kernel) writes only ``arguments``: what torch's
    analysis of it answers while ``dependent_launches()`` is on."""
    setattr(kernel, _WRITES, tuple(arguments))
    return kernel


def library_launches_dependent() -> bool:
    """Whether the kernels traced now go into a library that starts ``_gdc`` kernels as
    dependent launches (inside ``dependent_launches()``)."""
    return _active


def dependent_launch_here(device: torch.device) -> bool:
    """Whether kernels here may wait on the one before (griddepcontrol: Hopper and later)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def launcher(plain, dependent, device: torch.device, pdl: bool = False):
    """(grid -> the launch of ``plain`` or of its ``_gdc`` form ``dependent``, whether it is
    the dependent form). With ``pdl``, Triton's own launcher starts it as a dependent launch
    (the timing scripts and tests); else it goes through wrap_triton (what torch.export
    and AOTInductor trace into), the dependent form inside ``dependent_launches()``."""
    from torch.library import wrap_triton
    global _traced
    gdc = (pdl or _active) and dependent_launch_here(device)
    kernel = dependent if gdc else plain
    _traced = _traced or (gdc and not pdl)
    if pdl:
        return (lambda grid: functools.partial(kernel[grid], launch_pdl=True)), gdc
    return (lambda grid: wrap_triton(kernel)[grid]), gdc


def with_dependent_launches(driver: str) -> str | None:
    """The launcher source ``driver`` (AOTInductor's ``kernel_driver()``) with the ``_gdc``
    kernels started as dependent launches, or None where it is not laid out as expected."""
    if not _LOAD.search(driver) or len(_LAUNCH.findall(driver)) != 1:
        return None
    renamed = _LOAD.sub("static inline CUfunction loadKernelPlain(", driver)
    renamed = _LAUNCH.sub("static inline void launchKernelPlain(", renamed)
    return renamed + _HELPERS


@contextlib.contextmanager
def dependent_launches() -> Iterator[bool]:
    """While compiling: ``_gdc`` kernels are traced (library_launches_dependent()), their
    declared writes are what torch's analysis answers, and the launcher of a library that
    has one starts them as dependent launches (other libraries' are left as they are);
    yields whether this torch and GPU allow it."""
    global _active, _traced
    if (torch.version.hip is not None or os.environ.get(PLAIN_ENV)
            or not torch.cuda.is_available()
            or torch.cuda.get_device_capability()[0] < 9):
        yield False
        return
    with contextlib.ExitStack() as stack:
        if not (stack.enter_context(_launcher_rewritten())
                and stack.enter_context(_declared_writes_answered())):
            yield False
            return
        _active, _traced = True, False
        try:
            yield True
        finally:
            _active = _traced = False


@contextlib.contextmanager
def _launcher_rewritten() -> Iterator[bool]:
    try:
        from torch._inductor.codegen.cuda.device_op_overrides import CUDADeviceOpOverrides
    except ImportError:
        yield False
        return
    original = CUDADeviceOpOverrides.kernel_driver
    if with_dependent_launches(original(CUDADeviceOpOverrides())) is None:
        yield False
        return

    def kernel_driver(self) -> str:
        source = original(self)
        return (with_dependent_launches(source) if _traced else None) or source

    CUDADeviceOpOverrides.kernel_driver = kernel_driver
    try:
        yield True
    finally:
        CUDADeviceOpOverrides.kernel_driver = original


@contextlib.contextmanager
def _declared_writes_answered() -> Iterator[bool]:
    """torch's TTIR analysis (``identify_mutated_tensors`` up to some version,
    ``identify_accessed_tensors`` after), wherever it is looked up, answers a kernel's
    declared writes."""
    import torch._higher_order_ops.triton_kernel_wrap as wrap
    import torch._inductor.ir as ir
    patched = [(module, name, getattr(module, name))
               for module in (wrap, ir) for name in _ANALYSES if hasattr(module, name)]
    if not patched:
        yield False
        return
    for module, name, original in patched:
        setattr(module, name, _answering_declared(original, name))
    try:
        yield True
    finally:
        for module, name, original in patched:
            setattr(module, name, original)


def _answering_declared(original, name: str):
    @functools.wraps(original)
    def analysis(kernel, kwargs, *rest, **more):
        writes = getattr(kernel, _WRITES, None)
        if writes is None:
            writes = getattr(getattr(kernel, "fn", None), _WRITES, None)
        if writes is None:
            return original(kernel, kwargs, *rest, **more)
        written = [arg for arg in writes if arg in kwargs]
        if name == "identify_mutated_tensors":
            return written
        return _accesses(kwargs, written)
    return analysis


def _accesses(kwargs: dict, written: list[str]):
    """identify_accessed_tensors's answer: every tensor argument read, ``written`` written."""
    from torch._higher_order_ops.triton_kernel_wrap import TensorAccesses
    from torch._inductor.dependencies import ReadWrites, StarDep
    from torch._inductor.ir import TensorBox
    from torch.utils._ordered_set import OrderedSet
    reads = OrderedSet(StarDep(key) for key, value in kwargs.items()
                       if isinstance(value, (torch.Tensor, TensorBox)))
    return TensorAccesses(ReadWrites(reads=reads,
                                     writes=OrderedSet(StarDep(key) for key in written),
                                     index_exprs=OrderedSet()),
                          can_fuse_epilogue=False)
