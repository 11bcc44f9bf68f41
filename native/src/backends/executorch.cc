// The executorch backend: runs one partition's .pte with ExecuTorch's runtime from the
// executorch wheel (libexecutorch.so and its XNNPACK delegate), as
// runtime/executors/executorch.py does in Python.
//
// The program is opened with ExecuTorch's full flatbuffer verification; its planned
// arenas are allocated once, at the sizes its own memory plan (method_meta) gives, and
// reused by every call. Kernel libraries are opened only when the program calls kernels
// outside the delegates (executorch_kernels.cc), so a bundle ships only those it needs.
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <executorch/extension/data_loader/file_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/extension/threadpool/threadpool_guard.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/runtime.h>

#include "backend.h"
#include "backends/executorch_support.h"

namespace edge {
namespace {

namespace et = ::executorch::runtime;
using ::executorch::aten::ScalarType;
using ::executorch::extension::FileDataLoader;
using ::executorch::extension::MallocMemoryAllocator;
using ::executorch::extension::threadpool::NoThreadPoolGuard;

const char* kRebuild = "rebuild the artifact with `exporter build --target executorch`";

std::string meta_string(const Partition& partition, const char* key, const char* fallback) {
  const auto found = partition.meta.find(key);
  if (found == partition.meta.end() && fallback != nullptr) return fallback;
  if (found == partition.meta.end() || !found->is_string() || found->get<std::string>().empty()) {
    throw ArtifactError("partition '" + partition.name + "': its meta has no '" + key +
                            "' string",
                        "manifest.json", kRebuild);
  }
  return found->get<std::string>();
}

std::vector<std::string> meta_kernels(const Partition& partition) {
  const auto found = partition.meta.find("kernels");
  if (found == partition.meta.end() || found->is_null()) return {};
  std::vector<std::string> kernels;
  if (found->is_array()) {
    for (const auto& item : *found) {
      if (!item.is_string()) break;
      kernels.push_back(item.get<std::string>());
    }
    if (kernels.size() == found->size()) return kernels;
  }
  throw ArtifactError("partition '" + partition.name + "': its meta's 'kernels' is not a "
                      "list of operator names", "manifest.json", kRebuild);
}

class ExecutorchExecutor final : public Executor {
 public:
  explicit ExecutorchExecutor(const Partition& partition)
      : name_(partition.name), method_name_(meta_string(partition, "method", "forward")) {
    const std::string entry = meta_string(partition, "program", nullptr);
    where_ = entry;
    std::optional<NoThreadPoolGuard> no_pool;  // XNNPACK takes its pool when it loads
    if (et_support::single_threaded()) no_pool.emplace();
    et_support::load_kernels_for(meta_kernels(partition), name_, where_);
    open_program(partition.files_dir / entry);
    plan_and_load();
    check_arity(partition);
  }

  std::vector<Tensor> run(const std::vector<const Tensor*>& inputs) override {
    std::lock_guard<std::mutex> hold(lock_);  // a Method runs one call at a time
    std::optional<NoThreadPoolGuard> no_pool;
    if (et_support::single_threaded()) no_pool.emplace();
    if (inputs.size() != method_->inputs_size()) {
      throw ExecutionError("partition '" + name_ + "' takes " +
                               std::to_string(method_->inputs_size()) + " input(s), got " +
                               std::to_string(inputs.size()),
                           where_);
    }
    std::vector<et_support::InputView> views;
    views.reserve(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      views.emplace_back(*inputs[i], expected_input(i), i, name_, where_);
      et_support::check(method_->set_input(views.back().evalue(), i), "setting input " +
                        std::to_string(i) + " of", name_, where_);
    }
    et_support::check(method_->execute(), "running", name_, where_);
    std::vector<Tensor> outputs;
    outputs.reserve(method_->outputs_size());
    for (std::size_t i = 0; i < method_->outputs_size(); ++i) {
      outputs.push_back(et_support::copy_output(method_->get_output(i), i, name_, where_));
    }
    return outputs;
  }

 private:
  void open_program(const std::filesystem::path& path) {
    auto loader = FileDataLoader::from(path.c_str());
    if (!loader.ok()) {
      throw ArtifactError("ExecuTorch could not open partition '" + name_ + "' (" +
                              et_support::describe(loader.error()) + ")",
                          where_, kRebuild);
    }
    loader_ = std::make_unique<FileDataLoader>(std::move(loader.get()));
    auto program = et::Program::load(loader_.get(),
                                     et::Program::Verification::InternalConsistency);
    if (!program.ok()) {
      throw ArtifactError("ExecuTorch could not load partition '" + name_ + "' (" +
                              et_support::describe(program.error()) + ")",
                          where_, kRebuild);
    }
    program_ = std::make_unique<et::Program>(std::move(program.get()));
  }

  // The planned arenas, sized by the program's own plan, allocated once for every call.
  void plan_and_load() {
    auto meta = program_->method_meta(method_name_.c_str());
    if (!meta.ok()) {
      throw ArtifactError("partition '" + name_ + "': the program has no method '" +
                              method_name_ + "' (it has: " + method_names() + ")",
                          where_, kRebuild);
    }
    for (std::size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
      const auto size = static_cast<std::size_t>(meta->memory_planned_buffer_size(i).get());
      arenas_.emplace_back(new uint8_t[size == 0 ? 1 : size]);
      spans_.emplace_back(arenas_.back().get(), size);
    }
    planned_.emplace(et::Span<et::Span<uint8_t>>(spans_.data(), spans_.size()));
    memory_.emplace(&method_allocator_, &planned_.value(), &temp_allocator_);
    auto method = program_->load_method(method_name_.c_str(), &memory_.value());
    if (!method.ok()) {
      throw ArtifactError("ExecuTorch could not load method '" + method_name_ +
                              "' of partition '" + name_ + "' (" +
                              et_support::describe(method.error()) + ")",
                          where_, kRebuild);
    }
    method_ = std::make_unique<et::Method>(std::move(method.get()));
  }

  void check_arity(const Partition& partition) const {
    if (method_->inputs_size() != partition.inputs.size() ||
        method_->outputs_size() != partition.outputs.size()) {
      throw ArtifactError("partition '" + name_ + "': the program's method '" + method_name_ +
                              "' takes " + std::to_string(method_->inputs_size()) +
                              " input(s) and gives " + std::to_string(method_->outputs_size()) +
                              ", the manifest says " + std::to_string(partition.inputs.size()) +
                              " and " + std::to_string(partition.outputs.size()),
                          where_, kRebuild);
    }
  }

  et::TensorInfo expected_input(std::size_t index) const {
    auto info = method_->method_meta().input_tensor_meta(index);
    if (!info.ok()) {
      throw ArtifactError("partition '" + name_ + "': the program's input " +
                              std::to_string(index) + " is not a tensor",
                          where_, kRebuild);
    }
    return info.get();
  }

  std::string method_names() const {
    std::string names;
    for (std::size_t i = 0; i < program_->num_methods(); ++i) {
      auto found = program_->get_method_name(i);
      if (!found.ok()) continue;
      names += (names.empty() ? "" : ", ") + std::string(found.get());
    }
    return names;
  }

  std::string name_;
  std::string method_name_;
  std::string where_;
  std::unique_ptr<FileDataLoader> loader_;
  std::unique_ptr<et::Program> program_;
  std::vector<std::unique_ptr<uint8_t[]>> arenas_;
  std::vector<et::Span<uint8_t>> spans_;
  std::optional<et::HierarchicalAllocator> planned_;
  MallocMemoryAllocator method_allocator_;
  MallocMemoryAllocator temp_allocator_;
  std::optional<et::MemoryManager> memory_;
  std::unique_ptr<et::Method> method_;
  std::mutex lock_;
};

}  // namespace

void register_executorch_backend() {
  et_support::init_runtime();
  register_backend("executorch", [](const Partition& partition) -> std::unique_ptr<Executor> {
    return std::make_unique<ExecutorchExecutor>(partition);
  });
}

}  // namespace edge
