// A loaded artifact: verified archive, checked manifest, one executor per partition, run in
// manifest order with tensors passed by name (runtime/program/ is the Python twin).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "archive.h"
#include "backend.h"
#include "manifest.h"

namespace edge {

class Program {
 public:
  // Verify (and with a key, check the signature), check, then load every partition.
  static std::unique_ptr<Program> load(const std::string& path, const std::string& public_key);

  const std::vector<TensorSpec>& inputs() const { return manifest_.main.inputs; }
  const std::vector<TensorSpec>& outputs() const { return manifest_.main.outputs; }
  const std::string& source() const { return source_; }
  // Inputs in signature order (check_inputs first); outputs in signature order.
  std::vector<Tensor> run(const std::vector<const Tensor*>& inputs);
  // Orders named inputs as the signature does; InputMismatch (exit 2) names what is wrong.
  std::vector<const Tensor*> order(const std::vector<std::pair<std::string, const Tensor*>>& named) const;

 private:
  void check_inputs(const std::vector<const Tensor*>& inputs) const;

  std::string source_;
  std::unique_ptr<Archive> archive_;
  Manifest manifest_;
  std::vector<std::unique_ptr<Executor>> executors_;
};

// The native runner's checks of what a good artifact needs from this machine and runner:
// every partition's backend compiled in, CPU only, native code built for this architecture.
void check_native_compatibility(const Manifest& manifest, const std::string& where);

}  // namespace edge
