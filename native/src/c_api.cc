// The C API over edge::Program: handles, owned outputs, and errors kept per thread.
#include <cstring>
#include <new>

#include "edge_runtime.h"
#include "npy.h"
#include "program.h"

struct edge_program {
  std::unique_ptr<edge::Program> program;
};

struct edge_outputs {  // a list of tensors the runtime owns (outputs, or arrays read from a file)
  std::vector<std::string> names;
  std::vector<edge::Tensor> tensors;
  std::vector<edge_tensor> views;
};

namespace {

thread_local std::string last_message, last_json;
thread_local int last_code = 0;

std::string paragraph(const edge::Error& e) {
  std::string what = e.what();
  while (!what.empty() && what.back() == '.') what.pop_back();
  std::string text = what + ".";
  if (!e.where.empty()) text += " Where: " + e.where + ".";
  for (const auto& line : e.details) text += "\n  - " + line;
  if (!e.hint.empty()) text += "\nTry: " + e.hint;
  return text;
}

const char* type_of(const edge::Error& e) {
  if (dynamic_cast<const edge::CompatibilityError*>(&e)) return "CompatibilityError";
  if (dynamic_cast<const edge::ArtifactError*>(&e)) return "ArtifactError";
  if (dynamic_cast<const edge::ExecutionError*>(&e)) return "ExecutionError";
  return "Error";
}

void remember(const edge::Error& e, const char* type) {
  last_code = e.exit_code;
  last_message = paragraph(e);
  nlohmann::json json = {{"type", type}, {"exit_code", e.exit_code}, {"message", last_message},
                         {"what", e.what()}, {"where", e.where.empty() ? nlohmann::json() : nlohmann::json(e.where)},
                         {"hint", e.hint.empty() ? nlohmann::json() : nlohmann::json(e.hint)},
                         {"details", e.details}};
  last_json = json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Runs `body`, turning every exception into a code and a message: none crosses the C API.
template <typename Body>
int guarded(Body&& body) {
  last_code = 0;
  last_message.clear();
  last_json.clear();
  try {
    body();
    return 0;
  } catch (const edge::Error& e) {
    remember(e, type_of(e));
  } catch (const std::bad_alloc&) {
    remember(edge::Error(1, "out of memory", "", "free memory or use a smaller input"), "ExecutionError");
  } catch (const std::exception& e) {
    remember(edge::Error(4, std::string("internal error in the native runtime: ") + e.what(), "",
                         "please report this with the artifact and the command"), "InternalError");
  } catch (...) {
    remember(edge::Error(4, "internal error in the native runtime", "", "please report this"), "InternalError");
  }
  return last_code;
}

edge::Error usage(const std::string& what) { return edge::ArtifactError(what, "", "check the C API call"); }

edge::Tensor from_view(const edge_tensor& view, const std::string& label) {
  if (view.dtype == nullptr || view.rank < 0 || view.rank > EDGE_MAX_RANK || (view.data == nullptr && view.nbytes)) {
    throw usage("input " + label + " has no dtype, a bad rank or no data");
  }
  edge::Tensor t;
  t.dtype = edge::dtype_from_name(view.dtype);
  for (int32_t i = 0; i < view.rank; ++i) {
    if (view.shape[i] < 0) throw usage("input " + label + " has a negative dimension");
    t.shape.push_back(view.shape[i]);
  }
  if (t.numel() * edge::dtype_size(t.dtype) != view.nbytes) {
    throw usage("input " + label + " has " + std::to_string(view.nbytes) + " bytes, its shape and dtype need " +
                std::to_string(t.numel() * edge::dtype_size(t.dtype)));
  }
  const auto* p = static_cast<const std::byte*>(view.data);
  t.bytes.assign(p, p + view.nbytes);
  return t;
}

edge_outputs* own(std::vector<std::string> names, std::vector<edge::Tensor> tensors) {
  auto* out = new edge_outputs{std::move(names), std::move(tensors), {}};
  for (std::size_t i = 0; i < out->tensors.size(); ++i) {
    edge::Tensor& t = out->tensors[i];
    edge_tensor view{};
    view.name = out->names[i].c_str();
    view.dtype = edge::dtype_name(t.dtype);
    view.rank = static_cast<int32_t>(std::min<std::size_t>(t.shape.size(), EDGE_MAX_RANK));
    std::copy(t.shape.begin(), t.shape.begin() + view.rank, view.shape);
    view.data = t.bytes.data();
    view.nbytes = t.bytes.size();
    out->views.push_back(view);
  }
  return out;
}

std::vector<edge::Tensor> run(edge_program* program, const edge_tensor* inputs, size_t count) {
  if (program == nullptr || (inputs == nullptr && count)) throw usage("edge_run needs a program and inputs");
  std::vector<edge::Tensor> owned;
  bool named = count > 0;
  for (size_t i = 0; i < count; ++i) {
    named = named && inputs[i].name != nullptr;
    owned.push_back(from_view(inputs[i], inputs[i].name ? std::string("'") + inputs[i].name + "'" : std::to_string(i)));
  }
  std::vector<const edge::Tensor*> ordered;
  if (named) {
    std::vector<std::pair<std::string, const edge::Tensor*>> pairs;
    for (size_t i = 0; i < count; ++i) pairs.emplace_back(inputs[i].name, &owned[i]);
    ordered = program->program->order(pairs);
  } else {
    for (auto& t : owned) ordered.push_back(&t);
  }
  for (const auto& t : owned) {
    if (t.shape.size() > EDGE_MAX_RANK) throw usage("a tensor of rank over 16");
  }
  return program->program->run(ordered);
}

const edge::TensorSpec* spec(const edge_program* p, size_t index, bool input) {
  if (p == nullptr) return nullptr;
  const auto& specs = input ? p->program->inputs() : p->program->outputs();
  return index < specs.size() ? &specs[index] : nullptr;
}

}  // namespace

extern "C" {

int edge_load(const char* artifact_path, const char* public_key_path, edge_program** out) {
  if (out) *out = nullptr;
  return guarded([&] {
    if (artifact_path == nullptr || out == nullptr) throw usage("edge_load needs a path and an out pointer");
    auto program = edge::Program::load(artifact_path, public_key_path ? public_key_path : "");
    *out = new edge_program{std::move(program)};
  });
}

void edge_free(edge_program* program) { delete program; }

size_t edge_num_inputs(const edge_program* p) { return p ? p->program->inputs().size() : 0; }
size_t edge_num_outputs(const edge_program* p) { return p ? p->program->outputs().size() : 0; }
const char* edge_input_name(const edge_program* p, size_t i) { auto s = spec(p, i, true); return s ? s->name.c_str() : nullptr; }
const char* edge_input_dtype(const edge_program* p, size_t i) { auto s = spec(p, i, true); return s ? s->dtype.c_str() : nullptr; }
int32_t edge_input_rank(const edge_program* p, size_t i) { auto s = spec(p, i, true); return s ? static_cast<int32_t>(s->shape.size()) : -1; }
const char* edge_output_name(const edge_program* p, size_t i) { auto s = spec(p, i, false); return s ? s->name.c_str() : nullptr; }
const char* edge_output_dtype(const edge_program* p, size_t i) { auto s = spec(p, i, false); return s ? s->dtype.c_str() : nullptr; }
int32_t edge_output_rank(const edge_program* p, size_t i) { auto s = spec(p, i, false); return s ? static_cast<int32_t>(s->shape.size()) : -1; }

int64_t edge_input_dim(const edge_program* p, size_t i, int32_t axis) {
  auto s = spec(p, i, true);
  return s && axis >= 0 && static_cast<size_t>(axis) < s->shape.size() ? s->shape[axis].size : -1;
}

int64_t edge_output_dim(const edge_program* p, size_t i, int32_t axis) {
  auto s = spec(p, i, false);
  return s && axis >= 0 && static_cast<size_t>(axis) < s->shape.size() ? s->shape[axis].size : -1;
}

int edge_input_dim_range(const edge_program* p, size_t i, int32_t axis, int64_t* min, int64_t* max) {
  return guarded([&] {
    auto s = spec(p, i, true);
    if (!s || axis < 0 || static_cast<size_t>(axis) >= s->shape.size() || !min || !max) {
      throw usage("no such input dimension");
    }
    const auto& dim = s->shape[axis];
    *min = dim.dynamic() ? dim.min : dim.size;
    *max = dim.dynamic() ? dim.max : dim.size;
  });
}

int edge_run(edge_program* program, const edge_tensor* inputs, size_t num_inputs, edge_outputs** out) {
  if (out) *out = nullptr;
  return guarded([&] {
    if (out == nullptr) throw usage("edge_run needs an out pointer");
    auto results = run(program, inputs, num_inputs);
    std::vector<std::string> names;
    for (const auto& s : program->program->outputs()) names.push_back(s.name);
    *out = own(std::move(names), std::move(results));
  });
}

int edge_run_into(edge_program* program, const edge_tensor* inputs, size_t num_inputs, edge_tensor* outputs,
                  size_t num_outputs) {
  return guarded([&] {
    auto results = run(program, inputs, num_inputs);
    if (outputs == nullptr || num_outputs != results.size()) {
      throw usage("edge_run_into needs " + std::to_string(results.size()) + " output buffers");
    }
    for (size_t i = 0; i < results.size(); ++i) {
      if (results[i].bytes.size() > outputs[i].nbytes || results[i].shape.size() > EDGE_MAX_RANK ||
          (outputs[i].data == nullptr && !results[i].bytes.empty())) {
        throw usage("output buffer " + std::to_string(i) + " holds " + std::to_string(outputs[i].nbytes) +
                    " bytes; the output needs " + std::to_string(results[i].bytes.size()));
      }
    }
    for (size_t i = 0; i < results.size(); ++i) {
      edge_tensor& o = outputs[i];
      o.name = program->program->outputs()[i].name.c_str();
      o.dtype = edge::dtype_name(results[i].dtype);
      o.rank = static_cast<int32_t>(results[i].shape.size());
      std::copy(results[i].shape.begin(), results[i].shape.end(), o.shape);
      if (!results[i].bytes.empty()) std::memcpy(o.data, results[i].bytes.data(), results[i].bytes.size());
      o.nbytes = results[i].bytes.size();
    }
  });
}

size_t edge_outputs_count(const edge_outputs* o) { return o ? o->views.size() : 0; }
const edge_tensor* edge_outputs_get(const edge_outputs* o, size_t i) {
  return o && i < o->views.size() ? &o->views[i] : nullptr;
}
void edge_outputs_free(edge_outputs* o) { delete o; }

int edge_read_arrays(const char* path, const edge_program* program, edge_outputs** out) {
  if (out) *out = nullptr;
  return guarded([&] {
    if (path == nullptr || program == nullptr || out == nullptr) throw usage("edge_read_arrays needs a path, a program and an out pointer");
    const auto& inputs = program->program->inputs();
    // The most the inputs can take: every dynamic dim at its maximum, 8 bytes an element.
    uint64_t max_bytes = 0;
    for (const auto& spec : inputs) {
      uint64_t numel = 8;
      for (const auto& dim : spec.shape) {
        const auto size = static_cast<uint64_t>(dim.dynamic() ? dim.max : dim.size);
        numel = size && numel > (uint64_t{1} << 40) / size ? uint64_t{1} << 40 : numel * size;
      }
      max_bytes = std::min<uint64_t>(max_bytes + numel, uint64_t{1} << 40);
    }
    auto named = edge::read_arrays(path, inputs.size() == 1 ? inputs[0].name : "arr_0", max_bytes);
    std::vector<std::string> names;
    std::vector<edge::Tensor> tensors;
    for (auto& [name, tensor] : named) {
      if (tensor.shape.size() > EDGE_MAX_RANK) throw edge::ArtifactError("array of rank over 16", std::string(path) + ", array " + name);
      names.push_back(name);
      tensors.push_back(std::move(tensor));
    }
    *out = own(std::move(names), std::move(tensors));
  });
}

int edge_write_npz(const char* path, const edge_tensor* tensors, size_t count) {
  return guarded([&] {
    if (path == nullptr || (tensors == nullptr && count)) throw usage("edge_write_npz needs a path and tensors");
    edge::NamedTensors named;
    for (size_t i = 0; i < count; ++i) {
      named.emplace_back(tensors[i].name ? tensors[i].name : "arr_" + std::to_string(i),
                         from_view(tensors[i], std::to_string(i)));
    }
    edge::write_npz(path, named);
  });
}

const char* edge_last_error(void) { return last_message.c_str(); }
const char* edge_last_error_json(void) { return last_json.c_str(); }
int edge_last_exit_code(void) { return last_code; }

}  // extern "C"
