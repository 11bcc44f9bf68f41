// The executorch backend's helpers: ExecuTorch's log and errors in our words, the kernel
// libraries a program needs, and tensors across the boundary (dtype and shape checked).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/executor/method_meta.h>

#include "backend.h"

namespace edge::et_support {

// ExecuTorch's runtime once per process, with its log kept for our error messages.
void init_runtime();

// EDGE_THREADS=1: ExecuTorch runs on the calling thread (no thread pool is started);
// otherwise XNNPACK uses ExecuTorch's pool of one thread per processor, as in Python.
bool single_threaded();

// "InvalidProgram: <ExecuTorch's last logged error>" (the log line when there is one).
std::string describe(::executorch::runtime::Error error);

// ExecutionError "ExecuTorch failed <doing> partition '<name>' (...)" unless `error` is Ok.
void check(::executorch::runtime::Error error, const std::string& doing, const std::string& name,
           const std::string& where);

// Opens the wheel's kernel libraries (beside libexecutorch.so) that `kernels` (the
// partition meta's operator names) need and that are not registered yet; a library this
// runner was shipped without is a CompatibilityError naming it.
void load_kernels_for(const std::vector<std::string>& kernels, const std::string& name,
                      const std::string& where);

// One input as an ExecuTorch tensor over the caller's bytes (no copy), after checking
// its dtype and rank against what the program declares.
class InputView {
 public:
  InputView(const Tensor& tensor, const ::executorch::runtime::TensorInfo& expected,
            std::size_t index, const std::string& name, const std::string& where);
  InputView(const InputView&) = delete;
  InputView(InputView&& other) noexcept;
  ::executorch::runtime::EValue evalue();

 private:
  std::vector<::executorch::aten::SizesType> sizes_;
  std::vector<::executorch::aten::DimOrderType> dim_order_;
  std::vector<::executorch::aten::StridesType> strides_;
  ::executorch::aten::ScalarType scalar_type_;
  void* data_;
  std::unique_ptr<::executorch::aten::TensorImpl> impl_;
};

// A dense row-major copy of output `index` (any dim order ExecuTorch gives).
Tensor copy_output(const ::executorch::runtime::EValue& value, std::size_t index,
                   const std::string& name, const std::string& where);

}  // namespace edge::et_support
