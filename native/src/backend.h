// The contract between the native runtime's core and its backends.
//
// The core (artifact.cc, program.cc) reads the artifact zip, checks it as the Python
// loader does (docs/trust.md), writes the verified entries to a private folder and hands
// each partition to the executor factory registered for its backend kind. A backend owns
// nothing but turning a partition's files into something that maps input tensors to output
// tensors; scheduling, input checks and buffers are the core's (as runtime/program/ in Python).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace edge {

// The manifest's dtype names (runtime/format/dtypes.py) that native backends exchange.
enum class DType { float32, float16, bfloat16, float64, int8, uint8, int16, int32, int64, bool_ };

const char* dtype_name(DType dtype);           // the manifest's name, e.g. "float32"
DType dtype_from_name(const std::string& name);  // throws ArtifactError for an unknown name
std::size_t dtype_size(DType dtype);

// A dense, row-major, host-memory tensor. The core owns program inputs and outputs as these.
struct Tensor {
  DType dtype = DType::float32;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;  // numel() * dtype_size(dtype) bytes

  std::size_t numel() const;
};

// Errors a user can cause carry what, where and what to try, and map to the CLI's exit
// codes as the Python CLI's do (runtime/errors.py): 2 bad input or artifact, 3 a failed run.
struct Error : std::runtime_error {
  Error(int exit_code, const std::string& what, std::string where = "", std::string hint = "")
      : std::runtime_error(what), exit_code(exit_code), where(std::move(where)),
        hint(std::move(hint)) {}
  int exit_code;
  std::string where;
  std::string hint;
  std::vector<std::string> details;  // one line each, printed under the paragraph's first line
};
struct ArtifactError : Error {  // the artifact (or an input file) is bad: refused, exit 2
  ArtifactError(const std::string& what, std::string where = "", std::string hint = "")
      : Error(2, what, std::move(where), std::move(hint)) {}
};
struct CompatibilityError : Error {  // a good artifact this runner cannot run, exit 2
  CompatibilityError(const std::string& what, std::string where = "", std::string hint = "")
      : Error(2, what, std::move(where), std::move(hint)) {}
};
struct ExecutionError : Error {  // the backend failed while running, exit 3
  ExecutionError(const std::string& what, std::string where = "", std::string hint = "")
      : Error(3, what, std::move(where), std::move(hint)) {}
};

// One partition of a verified artifact, as the core hands it to a backend.
struct Partition {
  std::string name;                   // the manifest's partition name
  std::string backend;                // its executor kind: "executorch", "tvm", ...
  nlohmann::json meta;                // the partition's "meta" object, as in manifest.json
  std::filesystem::path files_dir;    // private folder of verified entries (names as in the zip)
  std::vector<std::string> inputs;    // tensor names, in call order
  std::vector<std::string> outputs;   // tensor names, in return order
};

class Executor {
 public:
  virtual ~Executor() = default;
  // Inputs in the partition's input order; outputs in its output order.
  virtual std::vector<Tensor> run(const std::vector<const Tensor*>& inputs) = 0;
};

using ExecutorFactory = std::function<std::unique_ptr<Executor>(const Partition&)>;

// Backends compiled into this runner register themselves here (register_builtin_backends()
// calls each backend's register function, chosen by the CMake options EDGE_WITH_*).
void register_backend(const std::string& kind, ExecutorFactory factory);
const ExecutorFactory* find_backend(const std::string& kind);
std::vector<std::string> registered_backends();
void register_builtin_backends();

// Each backend's own registration, defined in backends/<kind>.cc.
void register_executorch_backend();
void register_tvm_backend();

}  // namespace edge
