// Backend "tvm": one partition's exported Relax library on the Relax VM (CPU), as
// runtime/executors/tvm.py runs it. The weights come from the partition's safetensors file
// (checked against the manifest first) and are handed to main after the inputs.
#include <sched.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include "backend.h"
#include "backends/tvm_weights.h"

namespace edge {
namespace {

namespace ffi = tvm::ffi;
using tvm_backend::empty_tensor;

constexpr int kPooledAllocator = 2;  // relax.VirtualMachine's default (POOLED_ALLOCATOR)
const char* kRebuild = "rebuild the artifact with `exporter build`";

// The last line of a TVM error: its message, without the C++ backtrace.
std::string message_of(const std::exception& exc) {
  std::string text = exc.what();
  if (auto* error = dynamic_cast<const ffi::Error*>(&exc))
    text = error->kind() + ": " + error->message();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  std::size_t cut = text.rfind('\n');
  text = cut == std::string::npos ? text : text.substr(cut + 1);
  return text.substr(0, 300);
}

DLDataType dl_dtype(DType dtype) {
  switch (dtype) {
    case DType::float32: return {kDLFloat, 32, 1};
    case DType::float16: return {kDLFloat, 16, 1};
    case DType::bfloat16: return {kDLBfloat, 16, 1};
    case DType::float64: return {kDLFloat, 64, 1};
    case DType::int8: return {kDLInt, 8, 1};
    case DType::uint8: return {kDLUInt, 8, 1};
    case DType::int16: return {kDLInt, 16, 1};
    case DType::int32: return {kDLInt, 32, 1};
    case DType::int64: return {kDLInt, 64, 1};
    case DType::bool_: return {kDLBool, 8, 1};
  }
  throw std::logic_error("unknown edge::DType");
}

bool edge_dtype(DLDataType dl, DType& out) {
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16, DType::float64,
                      DType::int8, DType::uint8, DType::int16, DType::int32, DType::int64,
                      DType::bool_}) {
    DLDataType want = dl_dtype(dtype);
    if (want.code == dl.code && want.bits == dl.bits && dl.lanes == 1) {
      out = dtype;
      return true;
    }
  }
  return false;
}

// A meta field naming one of the partition's verified files: a relative entry name that
// stays inside files_dir and is a regular file there.
std::filesystem::path entry_path(const Partition& partition, const char* key,
                                 const std::string& where) {
  const nlohmann::json& meta = partition.meta;
  std::string name = meta.contains(key) && meta[key].is_string() ? meta[key].get<std::string>() : "";
  std::filesystem::path relative(name);
  bool inside = !name.empty() && relative.is_relative();
  for (const auto& part : relative) inside = inside && part != "..";
  std::filesystem::path path = partition.files_dir / relative;
  if (!inside || !std::filesystem::is_regular_file(path))
    throw ArtifactError("partition '" + partition.name + "' names no usable '" + key +
                            "' file in its meta (" + (name.empty() ? "none" : name) + ")",
                        where, kRebuild);
  return path;
}

// TVM's thread pool reads TVM_NUM_THREADS when it starts and otherwise counts physical
// cores by its own rule; the Python executor sets it the same way. A user's setting wins.
void default_thread_count() {
  cpu_set_t set;
  int count = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  setenv("TVM_NUM_THREADS", std::to_string(count > 0 ? count : 1).c_str(), 0);
}

// TVM logs every memory scope of a Relax VM executable it loads as a warning on std::cerr
// ("Scope Loaded:"), with no level or switch to turn it off (TVM_LOG_DEBUG only governs
// DLOG/VLOG). While loading, std::cerr is held: those lines are dropped, every other line
// TVM wrote is passed on, and its errors are exceptions, which this does not touch.
class QuietScopeLog {
 public:
  QuietScopeLog() : saved_(std::cerr.rdbuf(held_.rdbuf())) {}
  ~QuietScopeLog() {
    std::cerr.rdbuf(saved_);
    std::istringstream lines(held_.str());
    for (std::string line; std::getline(lines, line);) {
      if (line.find("executable.cc") == std::string::npos ||
          line.find(": Warning: Scope Loaded:") == std::string::npos) {
        std::cerr << line << '\n';
      }
    }
    std::cerr.flush();
  }
  QuietScopeLog(const QuietScopeLog&) = delete;
  QuietScopeLog& operator=(const QuietScopeLog&) = delete;

 private:
  std::ostringstream held_;
  std::streambuf* saved_;
};

class TvmExecutor : public Executor {
 public:
  explicit TvmExecutor(const Partition& partition)
      : name_(partition.name), where_("partition '" + partition.name + "'") {
    default_thread_count();
    std::filesystem::path library = entry_path(partition, "library", where_);
    std::filesystem::path params = entry_path(partition, "params", where_);
    load_library(library);
    const nlohmann::json& meta = partition.meta;
    nlohmann::json index;
    if (meta.contains("tensor_index") && meta["tensor_index"].is_object() &&
        meta["tensor_index"].contains("params"))
      index = meta["tensor_index"]["params"];
    params_ = tvm_backend::load_checked(params, index, where_ + ": " + params.filename().string());
    const nlohmann::json& count = meta.contains("num_params") ? meta["num_params"] : nlohmann::json();
    if (!count.is_number_unsigned() || count.get<uint64_t>() != params_.size())
      throw ArtifactError("partition '" + name_ + "' has " + std::to_string(params_.size()) +
                              " weights, its manifest says " + count.dump(),
                          where_, kRebuild);
  }

  std::vector<Tensor> run(const std::vector<const Tensor*>& inputs) override {
    std::vector<ffi::Tensor> held;  // the arguments' owners, alive through the call
    for (const Tensor* input : inputs) {
      ffi::Tensor tensor = empty_tensor(input->shape, dl_dtype(input->dtype));
      std::memcpy(tensor.data_ptr(), input->bytes.data(), input->bytes.size());
      held.push_back(std::move(tensor));
    }
    std::vector<ffi::AnyView> args(held.begin(), held.end());
    args.insert(args.end(), params_.begin(), params_.end());
    ffi::Any out;
    try {
      main_.CallPacked(args.data(), static_cast<int32_t>(args.size()), &out);
    } catch (const std::exception& exc) {  // a shape the VM's own checks refuse, and the like
      throw ExecutionError("TVM failed running partition '" + name_ + "' (" + message_of(exc) + ")",
                           where_);
    }
    return outputs_of(out);
  }

 private:
  void load_library(const std::filesystem::path& path) {
    std::string where = where_ + ": " + path.filename().string();
    try {
      QuietScopeLog quiet;
      library_ = ffi::Module::LoadFromFile(path.string());
      ffi::Optional<ffi::Function> load = (*library_)->GetFunction("vm_load_executable");
      if (!load) throw std::runtime_error("the library holds no Relax VM executable");
      vm_ = (*load)().cast<ffi::Module>();
      ffi::Optional<ffi::Function> init = (*vm_)->GetFunction("vm_initialization");
      if (!init) throw std::runtime_error("the Relax VM has no vm_initialization");
      (*init)(static_cast<int>(kDLCPU), 0, kPooledAllocator);
      ffi::Optional<ffi::Function> main = (*vm_)->GetFunction("main");
      if (!main) throw std::runtime_error("the Relax program has no function 'main'");
      main_ = *main;
    } catch (const std::exception& exc) {  // a verified library TVM refuses is bad input
      throw ArtifactError("TVM could not load partition '" + name_ + "' (" + message_of(exc) + ")",
                          where,
                          "the library is broken or was built for another TVM or platform (both "
                          "are in `exporter inspect`); rebuild the artifact with `exporter build`");
    }
  }

  // main returns a tuple (an ffi Array) of tensors, or one tensor.
  std::vector<Tensor> outputs_of(const ffi::Any& out) const {
    std::vector<Tensor> outputs;
    if (auto tensor = out.as<ffi::Tensor>()) {
      outputs.push_back(to_edge(*tensor, 0));
    } else if (auto tuple = out.as<ffi::Array<ffi::Any>>()) {
      for (std::size_t i = 0; i < tuple->size(); ++i) {
        auto item = (*tuple)[i].as<ffi::Tensor>();
        if (!item) throw bad_output(i, "is not a tensor");
        outputs.push_back(to_edge(*item, i));
      }
    } else {
      throw ExecutionError("TVM partition '" + name_ + "' returned a " + out.GetTypeKey() +
                               ", not tensors",
                           where_);
    }
    return outputs;
  }

  Tensor to_edge(const ffi::Tensor& tensor, std::size_t i) const {
    const DLTensor* dl = tensor.GetDLTensorPtr();
    Tensor result;
    if (dl->device.device_type != kDLCPU) throw bad_output(i, "is not in host memory");
    if (!tensor.IsContiguous()) throw bad_output(i, "is not dense");
    if (!edge_dtype(dl->dtype, result.dtype)) throw bad_output(i, "has a dtype the runner lacks");
    result.shape.assign(dl->shape, dl->shape + dl->ndim);
    result.bytes.resize(result.numel() * dtype_size(result.dtype));
    if (!result.bytes.empty())
      std::memcpy(result.bytes.data(), static_cast<const char*>(dl->data) + dl->byte_offset,
                  result.bytes.size());
    return result;
  }

  ExecutionError bad_output(std::size_t i, const std::string& what) const {
    return ExecutionError("TVM partition '" + name_ + "' output " + std::to_string(i) + " " + what,
                          where_);
  }

  std::string name_, where_;
  // the library outlives the VM and every tensor it returns (ffi::Module is never null)
  std::optional<ffi::Module> library_, vm_;
  ffi::Function main_;
  std::vector<ffi::Tensor> params_;
};

}  // namespace

void register_tvm_backend() {
  register_backend("tvm", [](const Partition& partition) -> std::unique_ptr<Executor> {
    return std::make_unique<TvmExecutor>(partition);
  });
}

}  // namespace edge
