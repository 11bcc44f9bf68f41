// backend.h's tables: dtypes and the registry of executor factories.
#include "backend.h"

#include <algorithm>
#include <map>
#include <mutex>

namespace edge {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  std::size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::float32, "float32", 4}, {DType::float16, "float16", 2},
    {DType::bfloat16, "bfloat16", 2}, {DType::float64, "float64", 8},
    {DType::int8, "int8", 1},         {DType::uint8, "uint8", 1},
    {DType::int16, "int16", 2},       {DType::int32, "int32", 4},
    {DType::int64, "int64", 8},       {DType::bool_, "bool", 1},
};

const DTypeInfo& info(DType dtype) {
  for (const auto& entry : kDTypes) {
    if (entry.dtype == dtype) return entry;
  }
  throw std::logic_error("dtype missing from the table");
}

std::map<std::string, ExecutorFactory>& registry() {
  static std::map<std::string, ExecutorFactory> factories;
  return factories;
}

std::mutex& registry_lock() {
  static std::mutex lock;
  return lock;
}

}  // namespace

const char* dtype_name(DType dtype) { return info(dtype).name; }

std::size_t dtype_size(DType dtype) { return info(dtype).size; }

DType dtype_from_name(const std::string& name) {
  for (const auto& entry : kDTypes) {
    if (name == entry.name) return entry.dtype;
  }
  throw ArtifactError("dtype '" + name + "' is not one the native runtime exchanges", "",
                      "rebuild the model with float32, float16, bfloat16, float64, int8, "
                      "uint8, int16, int32, int64 or bool tensors");
}

std::size_t Tensor::numel() const {
  std::size_t n = 1;
  for (int64_t d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

void register_backend(const std::string& kind, ExecutorFactory factory) {
  std::lock_guard<std::mutex> guard(registry_lock());
  registry()[kind] = std::move(factory);
}

const ExecutorFactory* find_backend(const std::string& kind) {
  std::lock_guard<std::mutex> guard(registry_lock());
  auto it = registry().find(kind);
  return it == registry().end() ? nullptr : &it->second;
}

std::vector<std::string> registered_backends() {
  std::lock_guard<std::mutex> guard(registry_lock());
  std::vector<std::string> kinds;
  for (const auto& [kind, factory] : registry()) kinds.push_back(kind);
  return kinds;
}

void register_builtin_backends() {
  static std::once_flag once;
  std::call_once(once, [] {
#ifdef EDGE_WITH_EXECUTORCH
    register_executorch_backend();
#endif
#ifdef EDGE_WITH_TVM
    register_tvm_backend();
#endif
  });
}

}  // namespace edge
