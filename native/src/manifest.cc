// Strict manifest JSON, the typed view and the cross-checks of the Python loader.
#include "manifest.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <stdexcept>

#include "archive.h"
#include "backend.h"
#include "json_strict.h"

namespace edge {
using nlohmann::json;
namespace {

const char* const kHint = "rebuild the artifact with `exporter build`";

// Every dtype torch names (runtime/format/dtypes.py NAMES): anything else is malformed.
const std::set<std::string>& dtype_names() {
  static const std::set<std::string> names = [] {
    std::set<std::string> all = {
        "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128", "bfloat16", "complex32",
        "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
        "float4_e2m1fn_x2", "qint8", "qint32", "quint8", "quint4x2", "quint2x4", "bits8",
        "bits16", "bits1x8", "bits2x4", "bits4x2"};
    for (int n = 1; n < 8; ++n) {
      all.insert("int" + std::to_string(n));
      all.insert("uint" + std::to_string(n));
    }
    return all;
  }();
  return names;
}

// A field that does not fit: Python's (exception type, message) for the malformed paragraph.
struct Malformed : std::runtime_error {
  Malformed(std::string kind, const std::string& what)
      : std::runtime_error(what), kind(std::move(kind)) {}
  std::string kind;
};

std::string type_name(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "NoneType";
    case json::value_t::boolean: return "bool";
    case json::value_t::number_float: return "float";
    case json::value_t::string: return "str";
    case json::value_t::array: return "list";
    case json::value_t::object: return "dict";
    default: return "int";
  }
}

const json& at(const json& object, const char* key) {
  if (!object.is_object()) {
    throw Malformed("TypeError", type_name(object) + " indices must be integers or slices, not str");
  }
  auto it = object.find(key);
  if (it == object.end()) throw Malformed("KeyError", py_repr(key));
  return *it;
}

std::string str(const json& value, const std::string& what) {
  if (!value.is_string()) throw Malformed("TypeError", what + " must be a string, not " + type_name(value));
  return value.get<std::string>();
}

int64_t count(const json& value, const std::string& what) {
  const bool ok = value.is_number_integer() && !value.is_boolean() &&
                  (value.is_number_unsigned() ? value.get<uint64_t>() < (1ull << 62)
                                              : value.get<int64_t>() >= 0);
  if (!ok) throw Malformed("ValueError", what + " must be a non-negative integer, not " + value.dump().substr(0, 40));
  return value.get<int64_t>();
}

const json& list(const json& value, const std::string& what) {
  if (!value.is_array()) throw Malformed("TypeError", what + " must be a list, not " + type_name(value));
  return value;
}

std::vector<std::string> strs(const json& value, const std::string& what) {
  std::vector<std::string> out;
  for (const auto& item : list(value, what)) out.push_back(str(item, "an item of " + what));
  return out;
}

bool truthy(const json& value) {
  return !(value.is_null() || (value.is_boolean() && !value.get<bool>()) ||
           (value.is_number() && value.get<double>() == 0) ||
           ((value.is_string() || value.is_array() || value.is_object()) && value.empty()));
}

json optional_dict(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  if (!it->is_object()) throw Malformed("TypeError", std::string(key) + " must be an object, not " + type_name(*it));
  return *it;
}

Dim read_dim(const json& raw) {
  Dim dim;
  if (raw.is_number_integer() && !raw.is_boolean()) {
    dim.size = count(raw, "a dimension");
    return dim;
  }
  dim.min = count(at(raw, "min"), "a dim's min");
  dim.max = count(at(raw, "max"), "a dim's max");
  if (dim.min > dim.max) {
    throw Malformed("ValueError", "a dim's min " + std::to_string(dim.min) + " is over its max " + std::to_string(dim.max));
  }
  dim.symbol = str(at(raw, "symbol"), "a dim's symbol");
  return dim;
}

TensorSpec read_tensor(const json& raw) {
  TensorSpec spec;
  spec.dtype = str(at(raw, "dtype"), "a tensor's dtype");
  if (!dtype_names().count(spec.dtype)) {
    throw Malformed("ValueError", py_repr(spec.dtype).substr(0, 40) + " is not a torch dtype");
  }
  spec.name = str(at(raw, "name"), "a tensor's name");
  for (const auto& dim : list(at(raw, "shape"), "a shape")) spec.shape.push_back(read_dim(dim));
  return spec;
}

PartitionSpec read_partition(const json& raw) {
  PartitionSpec p;
  p.device = str(at(raw, "device"), "a partition's device");
  if (p.device != "cpu" && p.device != "cuda") {
    throw Malformed("ValueError", "a partition's device is " + py_repr(p.device) + ", not 'cpu' or 'cuda'");
  }
  auto meta = raw.find("meta");
  p.meta = meta != raw.end() && truthy(*meta) ? *meta : json::object();
  if (!p.meta.is_object()) throw Malformed("TypeError", "a partition's meta must be an object");
  p.name = str(at(raw, "name"), "a partition's name");
  p.backend = str(at(raw, "backend"), "a partition's backend");
  p.files = strs(at(raw, "files"), "files");
  p.inputs = strs(at(raw, "inputs"), "inputs");
  p.outputs = strs(at(raw, "outputs"), "outputs");
  return p;
}

ProgramView read_view(const json& signature, const json& partitions) {
  ProgramView view;
  for (const auto& t : list(at(signature, "inputs"), "inputs")) view.inputs.push_back(read_tensor(t));
  for (const auto& t : list(at(signature, "outputs"), "outputs")) view.outputs.push_back(read_tensor(t));
  auto tree = signature.find("output_tree");
  view.output_tree = tree == signature.end() ? json(nullptr) : *tree;
  for (const auto& p : list(partitions, "partitions")) view.partitions.push_back(read_partition(p));
  return view;
}

void read_requirements(const json& raw, Manifest& m) {
  m.arch = str(at(raw, "arch"), "arch");
  m.torch = str(at(raw, "torch"), "torch");
  for (const char* key : {"cpu_isa", "cuda", "cuda_capability", "platform"}) {
    auto it = raw.find(key);
    if (it != raw.end() && !it->is_null()) {
      const std::string value = str(*it, key);
      if (std::string(key) == "cpu_isa") m.cpu_isa = value;
      if (std::string(key) == "platform") m.platform = value;
    }
  }
  if (m.platform.empty()) m.platform = "linux-" + normal_arch(m.arch);
  auto flags = raw.find("cpu_flags");
  if (flags != raw.end() && truthy(*flags)) m.cpu_flags = strs(*flags, "cpu_flags");
}

// Why `tree` cannot index `count` outputs exactly once (consistency._tree_problem), or "".
std::string walk_tree(const json& node, int depth, std::vector<int64_t>& leaves) {
  if (depth > 64) return "is nested more than 64 levels deep";
  if (!node.is_object()) return "has a node that is not an object (" + type_name(node) + ")";
  if (node.contains("leaf")) {
    const json& leaf = node["leaf"];
    if (!leaf.is_number_integer() || leaf.is_boolean()) return "has a leaf that is not an integer index";
    leaves.push_back(leaf.get<int64_t>());
    return "";
  }
  const json kind = node.value("kind", json(nullptr));
  const json items = node.value("items", json(nullptr));
  if (!(kind == "dict" || kind == "list" || kind == "tuple") || !items.is_array()) {
    return "has a node of unknown kind " + (kind.is_string() ? py_repr(kind.get<std::string>()) : kind.dump()).substr(0, 40);
  }
  if (kind == "dict") {
    const json keys = node.value("keys", json(nullptr));
    bool ok = keys.is_array() && keys.size() == items.size();
    for (const auto& k : keys.is_array() ? keys : json::array()) ok = ok && k.is_string();
    if (!ok) return "has a dict whose keys do not match its items";
  }
  for (const auto& child : items) {
    std::string problem = walk_tree(child, depth + 1, leaves);
    if (!problem.empty()) return problem;
  }
  return "";
}

}  // namespace

std::string normal_arch(const std::string& machine) {
  std::string lower = machine;
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "amd64" || lower == "x64") return "x86_64";
  if (lower == "arm64") return "aarch64";
  return machine;
}

Manifest read_manifest(const json& raw, const std::string& where) {
  Manifest m;
  try {
    const json& target = at(raw, "target");
    m.target = target.is_string() ? target.get<std::string>() : target.dump();
    m.main = read_view(at(raw, "signature"), at(raw, "partitions"));
    read_requirements(at(raw, "requirements"), m);
    auto entry_points = raw.find("entry_points");
    if (entry_points != raw.end() && truthy(*entry_points)) {
      if (!entry_points->is_object()) throw Malformed("AttributeError", "'" + type_name(*entry_points) + "' object has no attribute 'items'");
      for (const auto& [name, ep] : entry_points->items()) {
        m.entry_points[name] = read_view(at(ep, "signature"), at(ep, "partitions"));
      }
    }
    for (const char* key : {"memory_plan", "generation", "shared_weights"}) optional_dict(raw, key);
    m.shared_weights = optional_dict(raw, "shared_weights");
  } catch (const Malformed& exc) {
    throw ArtifactError("the manifest is malformed (" + exc.kind + ": " + exc.what() + ")", where, kHint);
  }
  return m;
}

void check_dataflow(const ProgramView& view, const std::string& where) {
  std::vector<std::string> problems;
  const auto repeated = [&](const char* what, const std::vector<std::string>& names) {
    std::set<std::string> seen, twice;
    for (const auto& n : names) {
      if (!seen.insert(n).second) twice.insert(n);
    }
    for (const auto& n : twice) problems.push_back(std::string("the ") + what + " name " + py_repr(n) + " is used twice");
  };
  std::vector<std::string> inputs, outputs, partitions;
  for (const auto& t : view.inputs) inputs.push_back(t.name);
  for (const auto& t : view.outputs) outputs.push_back(t.name);
  for (const auto& p : view.partitions) partitions.push_back(p.name);
  repeated("input", inputs);
  repeated("output", outputs);
  repeated("partition", partitions);
  if (view.partitions.empty()) problems.push_back("there are no partitions");
  std::set<std::string> known(inputs.begin(), inputs.end());
  for (const auto& p : view.partitions) {
    for (const auto& name : p.inputs) {
      if (!known.count(name)) {
        problems.push_back("partition " + py_repr(p.name) + " reads " + py_repr(name) +
                           ", which no program input or earlier partition gives");
      }
    }
    known.insert(p.outputs.begin(), p.outputs.end());
  }
  for (const auto& name : outputs) {
    if (!known.count(name)) problems.push_back("the program output " + py_repr(name) + " is made by no partition");
  }
  if (!view.output_tree.is_null()) {
    std::vector<int64_t> leaves;
    std::string problem = walk_tree(view.output_tree, 0, leaves);
    std::sort(leaves.begin(), leaves.end());
    bool exact = leaves.size() == outputs.size();
    for (std::size_t i = 0; exact && i < leaves.size(); ++i) exact = leaves[i] == static_cast<int64_t>(i);
    if (problem.empty() && !exact) {
      problem = "indexes outputs other than each of the " + std::to_string(outputs.size()) + " once";
    }
    if (!problem.empty()) problems.push_back("the output tree " + problem);
  }
  if (!problems.empty()) {
    ArtifactError error("the manifest is inconsistent", where, kHint);
    error.details = problems;
    throw error;
  }
}

void check_partition_files(const PartitionSpec& partition, const std::vector<std::string>& entries,
                           const std::string& where) {
  // The Entry fields of each native kind's meta (runtime/executors/<kind>.py).
  static const std::map<std::string, std::vector<std::string>> kEntryKeys = {
      {"tvm", {"library", "params"}}, {"executorch", {"program"}}};
  auto keys = kEntryKeys.find(partition.backend);
  if (keys == kEntryKeys.end()) return;
  const std::string bad = "partition " + py_repr(partition.name) + " has a malformed meta:";
  for (const auto& key : keys->second) {
    auto value = partition.meta.find(key);
    if (value == partition.meta.end() || value->is_null()) {
      throw ArtifactError(bad + " the required key " + py_repr(key) + " is " +
                              (value == partition.meta.end() ? "missing" : "null"), where, kHint);
    }
    if (!value->is_string()) {
      throw ArtifactError(bad + " " + py_repr(key) + " must be a string", where, kHint);
    }
    if (!std::binary_search(entries.begin(), entries.end(), value->get<std::string>())) {
      throw ArtifactError("partition '" + partition.name + "' points its " + py_repr(key) + " at " +
                              py_repr(value->get<std::string>()).substr(0, 200) +
                              ", which is not an entry of the artifact (only its own verified "
                              "entries are loaded)", where, kHint);
    }
  }
}

std::string Dim::describe() const {
  if (!dynamic()) return std::to_string(size);
  return symbol + "[" + std::to_string(min) + ".." + std::to_string(max) + "]";
}

std::string TensorSpec::describe() const {
  std::string out = name + ": " + dtype + "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + shape[i].describe();
  return out + "]";
}

}  // namespace edge
