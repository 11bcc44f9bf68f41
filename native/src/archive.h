// The artifact zip, read as hostile (runtime/format/archive.py is the Python twin): sizes,
// entry kinds and names, the manifest and every entry's SHA-256 are checked at open,
// before anything parses or loads a byte of it; entries are only ever copied into a
// private 0700 folder, re-hashed as they are written.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zip_checks.h"
#include "zip_reader.h"

namespace edge {

struct Limits {  // runtime.format.archive.Limits, same defaults
  uint64_t max_archive_bytes = 4ull << 30;
  uint64_t max_entries = 10000;
  uint64_t max_entry_bytes = 2ull << 30;
  uint64_t max_manifest_bytes = 16ull << 20;
  double max_compression_ratio = 200.0;
  uint64_t max_total_bytes = 8ull << 30;
};

inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kSignatureName = "manifest.sig";
inline constexpr uint64_t kMaxSignatureBytes = 4096;

class Archive {
 public:
  static std::unique_ptr<Archive> open(const std::string& path, const Limits& limits = {});
  ~Archive();
  Archive(const Archive&) = delete;
  Archive& operator=(const Archive&) = delete;

  const std::string& path() const { return path_; }
  const nlohmann::json& manifest() const { return manifest_; }
  const std::string& manifest_bytes() const { return manifest_bytes_; }  // what a signature signs
  std::vector<std::string> names() const;  // the manifest's entries, sorted
  std::optional<std::string> signature_bytes();
  // Copies `names` into a fresh 0700 folder (removed with the archive), re-hashing each.
  std::filesystem::path extract_private(const std::vector<std::string>& names);

 private:
  Archive(std::string path, std::unique_ptr<ZipReader> reader)
      : path_(std::move(path)), zip_(std::move(reader)) {}
  void check_structure(uint64_t file_size);
  void check_entry_kind(const ZipEntry& entry);
  void load_manifest();
  void check_entry_set();
  void verify_entry(const std::string& name);
  void copy_entry(const std::filesystem::path& root, const std::string& name);
  // Reads at most `limit` bytes of an entry into `sink` (chunk by chunk), hashing them.
  template <typename Sink>
  std::pair<std::string, uint64_t> stream(const std::string& name, uint64_t limit, Sink&& sink);
  const nlohmann::json& expected(const std::string& name) const;

  std::string path_;
  std::unique_ptr<ZipReader> zip_;
  Limits limits_;
  std::map<std::string, ZipEntry> entries_;
  nlohmann::json manifest_;
  std::string manifest_bytes_;
  std::vector<std::filesystem::path> private_dirs_;
};

}  // namespace edge
