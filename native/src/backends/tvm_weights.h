// A TVM partition's weights: a safetensors file, checked against the manifest's index
// before any tensor is read (as runtime/format/weights.py's load_checked does).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <tvm/ffi/container/tensor.h>

namespace edge::tvm_backend {

// 64-byte aligned host memory: TVM's kernels assume it (kAllocAlignment), and tensors in a
// safetensors file or an edge::Tensor are not aligned.
struct AlignedAlloc {
  void AllocData(DLTensor* tensor);
  void FreeData(DLTensor* tensor);
};

tvm::ffi::Tensor empty_tensor(const std::vector<int64_t>& shape, DLDataType dtype);

// The tensors of `path` in name order (the order main() takes them after the inputs), once
// its header is a well-formed safetensors header whose byte ranges tile the file and whose
// {name: [dtype, shape]} equals `expected`. ArtifactError naming the tensor otherwise.
std::vector<tvm::ffi::Tensor> load_checked(const std::filesystem::path& path,
                                           const nlohmann::json& expected,
                                           const std::string& where);

}  // namespace edge::tvm_backend
