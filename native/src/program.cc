// Loading and running a program natively, with the Python runtime's checks and words.
#include "program.h"

#include <sys/utsname.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "signing.h"

namespace edge {
namespace {

// Kinds that have a native backend in this repository (native/src/backends/).
const std::set<std::string> kNativeKinds = {"executorch", "tvm"};
// Kinds whose files are machine code built for one architecture (the rest are portable).
const std::set<std::string> kMachineCodeKinds = {"tvm", "aoti"};

std::string host_arch() {
  struct utsname name {};
  return uname(&name) == 0 ? name.machine : "unknown";
}

// This CPU's feature flags (x86 "flags", aarch64 "Features"), or empty where unknown.
std::set<std::string> cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      return {std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
    }
  }
  return {};
}

std::vector<const PartitionSpec*> all_partitions(const Manifest& m) {
  std::vector<const PartitionSpec*> out;
  for (const auto& p : m.main.partitions) out.push_back(&p);
  for (const auto& [name, view] : m.entry_points) {
    for (const auto& p : view.partitions) out.push_back(&p);
  }
  return out;
}

void check_machine_code(const Manifest& m, const std::string& where) {
  std::vector<const PartitionSpec*> native;
  for (const auto* p : all_partitions(m)) {
    if (kMachineCodeKinds.count(p->backend)) native.push_back(p);
  }
  if (native.empty()) return;
  const std::string host = "linux-" + normal_arch(host_arch());
  if (m.platform != host) {  // runtime.format.consistency._check_platform's words
    std::string parts;
    for (std::size_t i = 0; i < native.size() && i < 3; ++i) {
      parts += (i ? ", " : "") + py_repr(native[i]->name) + " (" + native[i]->backend + ")";
    }
    if (native.size() > 3) parts += " and " + std::to_string(native.size() - 3) + " more";
    throw CompatibilityError("the artifact was built for " + m.platform + " but this machine is " + host +
                                 ": partition " + parts + " holds native code compiled for " + m.platform,
                             where, "build it again with `exporter build --platform " + host +
                                        "` (on a target that builds for it), or run it on a " + m.platform +
                                        " machine");
  }
  const auto have = cpu_flags();
  std::vector<std::string> missing;
  for (const auto& flag : m.cpu_flags) {
    if (!have.empty() && !have.count(flag)) missing.push_back(flag);
  }
  if (!missing.empty()) {
    std::string list;
    for (const auto& f : missing) list += (list.empty() ? "" : ", ") + f;
    throw CompatibilityError("the artifact was compiled for the " + m.cpu_isa +
                                 " CPU instruction set, and this CPU lacks " +
                                 std::to_string(missing.size()) + " of the features it needs: " + list,
                             where, "rebuild with a lower --cpu-isa (e.g. `--cpu-isa avx2` or `--cpu-isa generic`)");
  }
}

std::vector<std::string> partition_entries(const Manifest& m, const std::vector<std::string>& names) {
  std::set<std::string> wanted;
  for (const auto* p : all_partitions(m)) {
    const std::string folder = "partitions/" + p->name + "/";
    for (const auto& n : names) {
      if (n.compare(0, folder.size(), folder) == 0) wanted.insert(n);
    }
    for (const auto& [key, value] : p->meta.items()) {  // Entry fields, checked to be entries
      if (value.is_string() && std::binary_search(names.begin(), names.end(), value.get<std::string>())) {
        wanted.insert(value.get<std::string>());
      }
    }
  }
  if (m.shared_weights.is_object() && m.shared_weights.value("entries", nlohmann::json()).is_object()) {
    for (const auto& [entry, index] : m.shared_weights["entries"].items()) {
      if (std::binary_search(names.begin(), names.end(), entry)) wanted.insert(entry);
    }
  }
  return {wanted.begin(), wanted.end()};
}

}  // namespace

void check_native_compatibility(const Manifest& m, const std::string& where) {
  register_builtin_backends();
  std::vector<std::string> foreign, missing_here;
  bool cuda = false;
  for (const auto* p : all_partitions(m)) {
    cuda = cuda || p->device == "cuda";
    if (find_backend(p->backend)) continue;
    (kNativeKinds.count(p->backend) ? missing_here : foreign)
        .push_back(py_repr(p->name) + " (" + p->backend + ")");
  }
  const auto join = [](const std::vector<std::string>& items) {
    std::string out;
    for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
    return out;
  };
  if (!foreign.empty()) {
    throw CompatibilityError(
        "the native runtime cannot run " + std::to_string(foreign.size()) +
            " partition(s) of this artifact: " + join(foreign) +
            "; only executorch and tvm partitions run natively", where,
        "rebuild it for a target that can go native (--target executorch or --target tvm) "
        "with `--fallback forbid`, so no partition falls back to torch; or run it with the "
        "Python runtime");
  }
  if (!missing_here.empty()) {
    throw CompatibilityError("this runner was built without the backend of partition(s) " +
                                 join(missing_here), where,
                             "build the runner with that backend (EDGE_WITH_EXECUTORCH / "
                             "EDGE_WITH_TVM; exporter/ship/native_runner.py backends=...)");
  }
  if (cuda) {
    throw CompatibilityError("the artifact runs partitions on CUDA, and the native runtime runs on "
                             "the CPU only", where, "rebuild it for a CPU target");
  }
  check_machine_code(m, where);
}

std::unique_ptr<Program> Program::load(const std::string& path, const std::string& public_key) {
  auto program = std::unique_ptr<Program>(new Program());
  program->source_ = path;
  program->archive_ = Archive::open(path);
  Archive& archive = *program->archive_;
  if (!public_key.empty()) verify_signature(archive, public_key);
  Manifest& m = program->manifest_;
  m = read_manifest(archive.manifest(), path);
  check_dataflow(m.main, path);
  for (const auto& [name, view] : m.entry_points) check_dataflow(view, path);
  const auto names = archive.names();
  for (const auto* p : all_partitions(m)) check_partition_files(*p, names, path);
  check_native_compatibility(m, path);
  // Backends open files only from this private copy of verified entries.
  const auto files_dir = archive.extract_private(partition_entries(m, names));
  for (const auto& spec : m.main.partitions) {
    Partition partition{spec.name, spec.backend, spec.meta, files_dir, spec.inputs, spec.outputs};
    program->executors_.push_back((*find_backend(spec.backend))(partition));
  }
  return program;
}

std::vector<const Tensor*> Program::order(
    const std::vector<std::pair<std::string, const Tensor*>>& named) const {
  std::map<std::string, const Tensor*> given;
  std::vector<std::string> details;
  for (const auto& [name, tensor] : named) given[name] = tensor;
  std::set<std::string> expected;
  std::string all;
  for (const auto& spec : inputs()) {
    expected.insert(spec.name);
    all += (all.empty() ? "" : ", ") + spec.name;
    if (!given.count(spec.name)) details.push_back("missing input '" + spec.name + "'");
  }
  for (const auto& [name, tensor] : given) {
    if (!expected.count(name)) details.push_back("unexpected input '" + name + "'");
  }
  if (!details.empty()) {
    ArtifactError error("the inputs given do not match the artifact's input names", source_,
                        "give exactly these inputs: " + all);
    error.details = details;
    throw error;
  }
  std::vector<const Tensor*> ordered;
  for (const auto& spec : inputs()) ordered.push_back(given[spec.name]);
  return ordered;
}

void Program::check_inputs(const std::vector<const Tensor*>& tensors) const {
  std::vector<std::string> problems;
  std::map<std::string, std::pair<int64_t, std::string>> symbols;  // value, first input
  for (std::size_t i = 0; i < inputs().size(); ++i) {
    const TensorSpec& spec = inputs()[i];
    const Tensor& t = *tensors[i];
    const std::string got = dtype_name(t.dtype);
    if (got != spec.dtype) {
      problems.push_back("input '" + spec.name + "': expected dtype " + spec.dtype + ", got " + got);
    }
    if (t.shape.size() != spec.shape.size()) {
      std::string shape;
      for (auto d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      if (t.shape.size() == 1) shape += ",";
      problems.push_back("input '" + spec.name + "': expected rank " + std::to_string(spec.shape.size()) +
                         " (" + spec.describe() + "), got shape (" + shape + ")");
      continue;
    }
    for (std::size_t axis = 0; axis < spec.shape.size(); ++axis) {
      const Dim& dim = spec.shape[axis];
      const int64_t size = t.shape[axis];
      const std::string at = "input '" + spec.name + "' dim " + std::to_string(axis);
      if (!dim.dynamic()) {
        if (size != dim.size) {
          problems.push_back(at + ": expected " + std::to_string(dim.size) + ", got " + std::to_string(size));
        }
        continue;
      }
      if (size < dim.min || size > dim.max) {
        problems.push_back(at + " (" + dim.symbol + "): " + std::to_string(size) + " is outside the built range " +
                           std::to_string(dim.min) + ".." + std::to_string(dim.max));
      }
      auto seen = symbols.emplace(dim.symbol, std::make_pair(size, spec.name)).first->second;
      if (seen.first != size) {
        problems.push_back(at + " (" + dim.symbol + ") is " + std::to_string(size) + " but input '" + seen.second +
                           "' has " + dim.symbol + "=" + std::to_string(seen.first) + "; they must be equal");
      }
    }
  }
  if (!problems.empty()) {
    std::string expects;
    for (const auto& spec : inputs()) expects += (expects.empty() ? "" : "; ") + spec.describe();
    ArtifactError error(std::to_string(problems.size()) + " problem(s) with the inputs", source_,
                        "the artifact expects " + expects);
    error.details = problems;
    throw error;
  }
}

std::vector<Tensor> Program::run(const std::vector<const Tensor*>& given) {
  if (given.size() != inputs().size()) {
    throw ArtifactError("the artifact takes " + std::to_string(inputs().size()) + " input tensor(s) and " +
                        std::to_string(given.size()) + " were given", source_,
                        "pass one tensor per input, in this order");
  }
  check_inputs(given);
  std::map<std::string, Tensor> made;  // partition outputs by tensor name
  std::map<std::string, const Tensor*> values;
  for (std::size_t i = 0; i < inputs().size(); ++i) values[inputs()[i].name] = given[i];
  for (std::size_t k = 0; k < executors_.size(); ++k) {
    const PartitionSpec& spec = manifest_.main.partitions[k];
    std::vector<const Tensor*> args;
    for (const auto& name : spec.inputs) args.push_back(values.at(name));
    std::vector<Tensor> results = executors_[k]->run(args);
    if (results.size() != spec.outputs.size()) {
      throw ExecutionError("partition '" + spec.name + "' returned " + std::to_string(results.size()) +
                           " tensor(s), its manifest says " + std::to_string(spec.outputs.size()), source_);
    }
    for (std::size_t j = 0; j < results.size(); ++j) {
      Tensor& slot = made[spec.outputs[j]] = std::move(results[j]);
      values[spec.outputs[j]] = &slot;
    }
  }
  std::vector<Tensor> out;
  for (const auto& spec : outputs()) out.push_back(*values.at(spec.name));
  return out;
}

}  // namespace edge
