// The typed view of manifest.json the native program needs (runtime/format/manifest.py and
// consistency.py are the Python twins): signature, partitions, requirements, with the
// field checks and cross-checks the Python loader makes at load.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace edge {

struct Dim {
  int64_t size = -1;  // -1: dynamic, then symbol and inclusive bounds
  std::string symbol;
  int64_t min = 0;
  int64_t max = 0;
  bool dynamic() const { return size < 0; }
  std::string describe() const;
};

struct TensorSpec {
  std::string name;
  std::string dtype;
  std::vector<Dim> shape;
  std::string describe() const;  // "x: float32[batch[1..8], 16]"
};

struct PartitionSpec {
  std::string name, backend, device;
  std::vector<std::string> files, inputs, outputs;
  nlohmann::json meta;
};

struct ProgramView {  // the main program, or one entry point
  std::vector<TensorSpec> inputs, outputs;
  nlohmann::json output_tree;
  std::vector<PartitionSpec> partitions;
};

struct Manifest {
  std::string target;
  ProgramView main;
  std::map<std::string, ProgramView> entry_points;
  std::string arch, torch, cpu_isa;
  std::string platform;  // requirements.platform, or linux-<arch> for older artifacts
  std::vector<std::string> cpu_flags;
  nlohmann::json shared_weights;  // null or {"entries": {...}, ...}
};

// What platform.machine() says elsewhere for the same architecture: "arm64" -> "aarch64".
std::string normal_arch(const std::string& machine);
// ArtifactError "the manifest is malformed (...)" for a missing or mistyped field.
Manifest read_manifest(const nlohmann::json& raw, const std::string& where);
// check_dataflow: names unique, every partition input made earlier, every output made.
void check_dataflow(const ProgramView& view, const std::string& where);
// The meta keys a partition's backend opens as files name verified entries of this artifact.
void check_partition_files(const PartitionSpec& partition, const std::vector<std::string>& entries,
                           const std::string& where);

}  // namespace edge
