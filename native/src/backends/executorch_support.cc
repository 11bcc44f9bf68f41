// The executorch backend's helpers (executorch_support.h).
#include "backends/executorch_support.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

namespace edge::et_support {
namespace {

namespace et = ::executorch::runtime;
using ::executorch::aten::ScalarType;

const char* kRepackage = "package the artifact again with `exporter package --native`, which "
                         "ships the kernel libraries its programs call";

thread_local std::string last_logged_error;

// ExecuTorch logs through its PAL: errors are kept for the next message we raise, the
// rest (thread pool and CPU probing chatter) is dropped.
void keep_errors(et_timestamp_t, et_pal_log_level_t level, const char*, const char*, size_t,
                 const char* message, size_t length) {
  if (level == kError || level == kFatal) {
    last_logged_error.assign(message, length);
    while (!last_logged_error.empty() && last_logged_error.back() == '\n') {
      last_logged_error.pop_back();
    }
  }
}

struct DTypePair {
  DType dtype;
  ScalarType scalar;
};
constexpr DTypePair kDTypes[] = {
    {DType::float32, ScalarType::Float}, {DType::float16, ScalarType::Half},
    {DType::bfloat16, ScalarType::BFloat16}, {DType::float64, ScalarType::Double},
    {DType::int8, ScalarType::Char},     {DType::uint8, ScalarType::Byte},
    {DType::int16, ScalarType::Short},   {DType::int32, ScalarType::Int},
    {DType::int64, ScalarType::Long},    {DType::bool_, ScalarType::Bool},
};

ScalarType to_scalar(DType dtype) {
  for (const auto& pair : kDTypes) {
    if (pair.dtype == dtype) return pair.scalar;
  }
  throw std::logic_error("dtype missing from the executorch table");
}

const DType* from_scalar(ScalarType scalar) {
  for (const auto& pair : kDTypes) {
    if (pair.scalar == scalar) return &pair.dtype;
  }
  return nullptr;
}

std::string scalar_name(ScalarType scalar) {
  const DType* dtype = from_scalar(scalar);
  return dtype ? dtype_name(*dtype) : "ExecuTorch type " + std::to_string(int(scalar));
}

template <typename Seq>
std::string shape_text(const Seq& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return text + "]";
}

// Which wheel library registers an operator: q/dq ops live in the quantized kernels,
// everything else outside the runtime's own primitives in the optimized (CPU) kernels.
std::string library_for(const std::string& op) {
  return op.rfind("quantized_decomposed::", 0) == 0 ? "libexecutorch_kernels_quantized.so"
                                                    : "libexecutorch_kernels_optimized.so";
}

bool registered(const std::string& op) {
  for (const auto& kernel : et::get_registered_kernels()) {
    if (op == kernel.name_) return true;
  }
  return false;
}

// The folder libexecutorch.so was loaded from: the kernel libraries sit beside it. Asked
// of the loader's own map (the address of a runtime function taken here may be this
// program's PLT entry, not the library's).
std::filesystem::path runtime_dir() {
  void* handle = dlopen("libexecutorch.so", RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return {};
  link_map* map = nullptr;
  const bool found = dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name;
  std::filesystem::path dir = found ? std::filesystem::path(map->l_name).parent_path()
                                    : std::filesystem::path();
  dlclose(handle);
  return dir;
}

bool is_row_major(const ::executorch::aten::Tensor& tensor) {
  int64_t stride = 1;
  for (std::size_t d = tensor.sizes().size(); d-- > 0;) {
    if (tensor.sizes()[d] != 1 && tensor.strides()[d] != stride) return false;
    stride *= tensor.sizes()[d];
  }
  return true;
}

std::mutex& kernels_lock() {
  static std::mutex lock;
  return lock;
}

}  // namespace

void init_runtime() {
  static std::once_flag once;
  std::call_once(once, [] {
    et::register_pal(et::PalImpl::create(keep_errors, __FILE__));
    et::runtime_init();
  });
}

bool single_threaded() {
  static const bool single = [] {
    const char* value = std::getenv("EDGE_THREADS");
    return value != nullptr && std::string(value) == "1";
  }();
  return single;
}

std::string describe(et::Error error) {
  std::string text = et::to_string(error);
  if (!last_logged_error.empty()) text += ": " + last_logged_error;
  last_logged_error.clear();
  return text;
}

void check(et::Error error, const std::string& doing, const std::string& name,
           const std::string& where) {
  if (error == et::Error::Ok) return;
  throw ExecutionError("ExecuTorch failed " + doing + " partition '" + name + "' (" +
                           describe(error) + ")",
                       where);
}

void load_kernels_for(const std::vector<std::string>& kernels, const std::string& name,
                      const std::string& where) {
  std::lock_guard<std::mutex> hold(kernels_lock());
  std::set<std::string> libraries;
  for (const auto& op : kernels) {
    if (!registered(op)) libraries.insert(library_for(op));
  }
  const auto dir = runtime_dir();
  for (const auto& library : libraries) {
    const auto path = dir.empty() ? std::filesystem::path(library) : dir / library;
    if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      const char* why = dlerror();
      throw CompatibilityError("partition '" + name + "' calls ExecuTorch kernels from " +
                                   library + ", which this runner cannot open (" +
                                   (why ? why : "unknown") + ")",
                               where, kRepackage);
    }
  }
  std::string missing;
  for (const auto& op : kernels) {
    if (!registered(op)) missing += (missing.empty() ? "" : ", ") + op;
  }
  if (!missing.empty()) {
    throw CompatibilityError("partition '" + name + "' calls operators this runner's "
                             "ExecuTorch has no kernel for: " + missing,
                             where, "rebuild the artifact with the ExecuTorch version of the "
                                    "runner (`exporter inspect` shows the build's)");
  }
}

InputView::InputView(const Tensor& tensor, const et::TensorInfo& expected, std::size_t index,
                     const std::string& name, const std::string& where)
    : scalar_type_(to_scalar(tensor.dtype)), data_(const_cast<std::byte*>(tensor.bytes.data())) {
  const std::string which = "input " + std::to_string(index) + " of partition '" + name + "'";
  if (scalar_type_ != expected.scalar_type()) {
    throw ArtifactError(which + " is " + dtype_name(tensor.dtype) + " but the program takes " +
                            scalar_name(expected.scalar_type()),
                        where, "rebuild the artifact: its manifest and program disagree");
  }
  const auto bound = expected.sizes();
  if (tensor.shape.size() != bound.size()) {
    throw ArtifactError(which + " has shape " + shape_text(tensor.shape) + " but the program "
                            "takes rank " + std::to_string(bound.size()) + " (" +
                            shape_text(bound) + ")",
                        where, "rebuild the artifact: its manifest and program disagree");
  }
  for (std::size_t d = 0; d < bound.size(); ++d) {
    if (tensor.shape[d] < 0 || tensor.shape[d] > bound[d]) {
      throw ExecutionError(which + " has shape " + shape_text(tensor.shape) + ", beyond the " +
                               "largest the program was planned for (" + shape_text(bound) + ")",
                           where, "give inputs within the bounds `exporter inspect` shows");
    }
    sizes_.push_back(static_cast<::executorch::aten::SizesType>(tensor.shape[d]));
    dim_order_.push_back(static_cast<::executorch::aten::DimOrderType>(d));
  }
  if (tensor.bytes.size() != tensor.numel() * dtype_size(tensor.dtype)) {
    throw ExecutionError(which + " holds " + std::to_string(tensor.bytes.size()) +
                             " bytes, not the " + shape_text(tensor.shape) + " its shape says",
                         where);
  }
  strides_.resize(sizes_.size());
  ::executorch::aten::StridesType stride = 1;
  for (std::size_t d = sizes_.size(); d-- > 0;) {
    strides_[d] = stride;
    stride *= sizes_[d];
  }
}

InputView::InputView(InputView&& other) noexcept
    : sizes_(std::move(other.sizes_)), dim_order_(std::move(other.dim_order_)),
      strides_(std::move(other.strides_)), scalar_type_(other.scalar_type_),
      data_(other.data_), impl_(std::move(other.impl_)) {}

et::EValue InputView::evalue() {
  // ExecuTorch copies into its planned input (or points at ours) inside set_input.
  impl_ = std::make_unique<::executorch::aten::TensorImpl>(
      scalar_type_, static_cast<ssize_t>(sizes_.size()), sizes_.data(), data_,
      dim_order_.data(), strides_.data(), ::executorch::aten::TensorShapeDynamism::DYNAMIC_BOUND);
  return et::EValue(::executorch::aten::Tensor(impl_.get()));
}

Tensor copy_output(const et::EValue& value, std::size_t index, const std::string& name,
                   const std::string& where) {
  const std::string which = "output " + std::to_string(index) + " of partition '" + name + "'";
  if (!value.isTensor()) {
    throw ArtifactError(which + " is not a tensor", where,
                        "rebuild the artifact with `exporter build --target executorch`");
  }
  const auto& source = value.toTensor();
  const DType* dtype = from_scalar(source.scalar_type());
  if (dtype == nullptr) {
    throw ExecutionError(which + " is " + scalar_name(source.scalar_type()) +
                             ", which the native runtime does not exchange",
                         where);
  }
  Tensor out;
  out.dtype = *dtype;
  out.shape.assign(source.sizes().begin(), source.sizes().end());
  const std::size_t item = dtype_size(out.dtype);
  out.bytes.resize(out.numel() * item);
  const auto* src = source.const_data_ptr<uint8_t>();
  if (is_row_major(source)) {
    std::memcpy(out.bytes.data(), src, out.bytes.size());
    return out;
  }
  // Dense row-major copy by the tensor's own strides (a channels-last output included).
  const std::size_t rank = out.shape.size();
  std::vector<int64_t> at(rank, 0);
  for (std::size_t flat = 0; flat < out.numel(); ++flat) {
    int64_t offset = 0;
    for (std::size_t d = 0; d < rank; ++d) offset += at[d] * source.strides()[d];
    std::memcpy(out.bytes.data() + flat * item, src + offset * item, item);
    for (std::size_t d = rank; d-- > 0;) {
      if (++at[d] < out.shape[d]) break;
      at[d] = 0;
    }
  }
  return out;
}

}  // namespace edge::et_support
