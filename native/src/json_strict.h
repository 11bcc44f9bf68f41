// manifest.json's bytes as runtime/format/manifest_json.py reads them: strict JSON (no
// duplicate keys, no NaN), an object of a format version this runtime reads, with a
// well-formed entry list. Also used for the signature entry and npy headers' neighbours.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace edge {

inline constexpr const char* kFormatName = "edge-export-artifact";
inline constexpr const char* kFormatVersion = "1.0";

// Strict JSON: throws std::invalid_argument naming what is wrong (duplicate key, depth,
// syntax); callers wrap it in their own error.
nlohmann::json parse_strict_json(const std::string& text);

// The manifest object, or ArtifactError (CompatibilityError for a newer major) at `where`.
nlohmann::json parse_manifest_json(const std::string& raw, const std::string& where);

}  // namespace edge
