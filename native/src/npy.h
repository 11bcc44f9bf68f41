// Inputs and outputs as numpy files: .npy (one array) and .npz (a zip of .npy entries),
// read strictly (little-endian, C order, the dtypes of backend.h; no object arrays, no
// pickles) and written whole (a temp file renamed into place).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend.h"

namespace edge {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// .npz: one tensor per entry, named without ".npy"; .npy: one tensor named `single_name`.
// ArtifactError (exit 2) naming the file and the array on anything malformed, and on
// arrays adding up to more than `max_bytes` (checked from the zip directory first).
NamedTensors read_arrays(const std::string& path, const std::string& single_name,
                         uint64_t max_bytes);
// Writes an .npz (stored entries, in the given order) to path.tmp-XXXX, then renames it.
void write_npz(const std::string& path, const NamedTensors& tensors);

// The .npy bytes of one tensor, and the reverse (`where` names it in errors).
std::string npy_bytes(const Tensor& tensor);
Tensor parse_npy(const std::string& bytes, const std::string& where);

}  // namespace edge
