// The artifact reader; its checks follow runtime/format/archive.py, in the same order.
#include "archive.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "backend.h"
#include "json_strict.h"
#include "sha256.h"
#include "zip_checks.h"
#include "zip_reader.h"

namespace edge {
namespace fs = std::filesystem;
namespace {

constexpr uint64_t kRatioMinBytes = 1 << 20;  // small entries may compress very well
constexpr uint64_t kMaxDirBytesPerEntry = 4096;
const char* const kHintRebuild = "do not use this file; rebuild the artifact with the exporter";
const char* const kHintModified =
    "the file was modified or corrupted after it was built; copy it again from its source "
    "or rebuild the artifact";

[[noreturn]] void not_a_zip(const std::string& path) {
  throw ArtifactError("not a valid artifact (truncated or not a zip)", path, kHintModified);
}

}  // namespace

std::unique_ptr<Archive> Archive::open(const std::string& path, const Limits& limits) {
  // O_NONBLOCK: opening a FIFO must not hang before fstat can refuse it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      throw ArtifactError("artifact file not found", path,
                          "check the path, or build the artifact first");
    }
    throw ArtifactError(std::string("cannot open the artifact file (") + std::strerror(errno) + ")",
                        path, "check the path and its permissions");
  }
  struct stat st {};
  std::string problem, hint;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    problem = "not a regular file";
    hint = "pass the path of the artifact file itself";
  } else if (static_cast<uint64_t>(st.st_size) > limits.max_archive_bytes) {
    problem = "artifact is " + std::to_string(st.st_size) + " bytes, over the " +
              std::to_string(limits.max_archive_bytes) + "-byte limit";
    hint = "raise Limits.max_archive_bytes if you trust this file";
  }
  uint64_t count = 0, dir_bytes = 0, dir_offset = 0;
  if (problem.empty() && !declared_directory(fd, st.st_size, count, dir_bytes, dir_offset)) {
    ::close(fd);
    not_a_zip(path);
  }
  if (problem.empty() && (count > limits.max_entries ||
                          dir_bytes > limits.max_entries * kMaxDirBytesPerEntry)) {
    problem = "artifact declares " + std::to_string(count) + " entries in a " +
              std::to_string(dir_bytes) + "-byte directory, over the limit of " +
              std::to_string(limits.max_entries);
    hint = kHintRebuild;
  }
  if (!problem.empty()) {
    ::close(fd);
    throw ArtifactError(problem, path, hint);
  }
  auto reader = ZipReader::open_fd(fd);  // reads through its own copy of fd
  ::close(fd);
  if (!reader) not_a_zip(path);
  std::unique_ptr<Archive> self(new Archive(path, std::move(reader)));
  self->limits_ = limits;
  self->check_structure(st.st_size);
  self->load_manifest();
  self->check_entry_set();
  for (const auto& name : self->names()) self->verify_entry(name);
  return self;
}

Archive::~Archive() {
  for (const auto& dir : private_dirs_) {
    std::error_code ignored;  // best effort: the folder is private and under a temp root
    fs::remove_all(dir, ignored);
  }
}

void Archive::check_structure(uint64_t file_size) {
  const uint64_t count = zip_->count();
  if (count > limits_.max_entries) {
    throw ArtifactError("artifact has " + std::to_string(count) + " entries, over the limit of " +
                        std::to_string(limits_.max_entries), path_, kHintRebuild);
  }
  std::vector<ZipEntry> records;
  if (!zip_->entries(records)) not_a_zip(path_);
  uint64_t packed_total = 0, total = 0;
  for (const auto& record : records) {
    // Names as Python's zipfile decodes them (ZipInfo.orig_filename, a NUL kept).
    if (entries_.count(record.name)) {
      throw ArtifactError("duplicate entry name", where_entry(path_, record.name), kHintRebuild);
    }
    check_entry_kind(record);
    packed_total += record.packed;
    total += record.size;
  }
  for (const auto& [name, entry] : entries_) {
    const std::string problem = name_problem(name);
    if (!problem.empty()) {
      throw ArtifactError("unsafe entry name: " + problem, where_entry(path_, name), kHintRebuild);
    }
  }
  for (const auto& [name, entry] : entries_) {  // 'a' and 'a/b': not extractable
    for (std::size_t cut = name.find('/'); cut != std::string::npos; cut = name.find('/', cut + 1)) {
      if (entries_.count(name.substr(0, cut))) {
        throw ArtifactError("entry name is used both as a file and as a directory",
                            where_entry(path_, name.substr(0, cut)), kHintRebuild);
      }
    }
  }
  // Overlapping entries let a small file expand many times over (a "zip quine" bomb).
  if (packed_total > file_size) {
    throw ArtifactError("entries overlap or claim more data than the file holds", path_,
                        kHintRebuild);
  }
  const uint64_t packed = std::max<uint64_t>(packed_total, 1);
  if (total > limits_.max_total_bytes) {
    throw ArtifactError("the entries inflate to " + std::to_string(total) + " bytes, over the " +
                        std::to_string(limits_.max_total_bytes) +
                        "-byte limit (Limits.max_total_bytes)", path_, kHintRebuild);
  }
  if (total >= kRatioMinBytes && total > limits_.max_compression_ratio * packed) {
    throw ArtifactError("the entries expand " + std::to_string(packed) + " bytes to " +
                        std::to_string(total) + " (ratio over 200; a zip bomb?)", path_,
                        kHintRebuild);
  }
}

void Archive::check_entry_kind(const ZipEntry& entry) {
  const std::string& name = entry.name;
  const uint32_t mode = entry.attributes >> 16, kind = mode & S_IFMT;
  std::string problem;
  if (name.empty()) {
    problem = "entry has an empty name";
  } else if (entry.flags & 0x1) {
    problem = "entry is encrypted";
  } else if (kind == S_IFLNK) {
    problem = "entry is a symbolic link";
  } else if (name.back() == '/' || kind == S_IFDIR) {
    problem = "entry is a directory";
  } else if (kind != 0 && kind != S_IFREG) {
    char octal[32];
    std::snprintf(octal, sizeof octal, "0o%o", mode);
    problem = std::string("entry is not a regular file (mode ") + octal + ")";
  } else if (entry.method != 0 && entry.method != 8) {  // stored, deflated
    problem = "entry uses unsupported compression method " + std::to_string(entry.method);
  } else if (entry.size > limits_.max_entry_bytes) {
    problem = "entry is " + std::to_string(entry.size) + " bytes, over the " +
              std::to_string(limits_.max_entry_bytes) + "-byte limit";
  } else if (entry.size >= kRatioMinBytes &&
             entry.size > limits_.max_compression_ratio * std::max<uint64_t>(entry.packed, 1)) {
    problem = "entry expands " + std::to_string(entry.packed) + " bytes to " +
              std::to_string(entry.size) + " (ratio over 200; a zip bomb?)";
  }
  if (!problem.empty()) throw ArtifactError(problem, where_entry(path_, name), kHintRebuild);
  entries_[name] = entry;
}

template <typename Sink>
std::pair<std::string, uint64_t> Archive::stream(const std::string& name, uint64_t limit,
                                                 Sink&& sink) {
  const auto corrupt = [&](const std::string& why) {
    return ArtifactError("entry data is corrupt (" + why + ")", where_entry(path_, name),
                         kHintModified);
  };
  Sha256 hash;
  uint64_t size = 0;
  try {
    zip_->read(entries_.at(name), limit, [&](const unsigned char* data, std::size_t n) {
      sink(data, n);
      hash.update(data, n);
      size += n;
    });
  } catch (const ZipDataError& exc) {
    throw corrupt(exc.what());
  }
  return {hash.hex(), size};
}

void Archive::load_manifest() {
  const auto bad = [&](const std::string& what) {
    return ArtifactError(what, where_entry(path_, kManifestName), kHintRebuild);
  };
  auto it = entries_.find(kManifestName);
  if (it == entries_.end()) {
    throw bad("artifact has no manifest.json (not an artifact, or built by another tool)");
  }
  if (it->second.size > limits_.max_manifest_bytes) {
    throw bad("manifest is " + std::to_string(it->second.size) + " bytes, over the " +
              std::to_string(limits_.max_manifest_bytes) + "-byte limit");
  }
  stream(kManifestName, limits_.max_manifest_bytes + 1,
         [&](const unsigned char* data, std::size_t n) {
           manifest_bytes_.append(reinterpret_cast<const char*>(data), n);
         });
  manifest_ = parse_manifest_json(manifest_bytes_, where_entry(path_, kManifestName));
}

void Archive::check_entry_set() {
  std::vector<std::string> details;
  for (const auto& [name, record] : manifest_["entries"].items()) {
    if (!entries_.count(name) || name == kManifestName || name == kSignatureName) {
      details.push_back("listed in the manifest but missing from the archive: " + py_repr(name));
    }
  }
  for (const auto& [name, entry] : entries_) {
    if (name != kManifestName && name != kSignatureName && !manifest_["entries"].contains(name)) {
      details.push_back("in the archive but not listed in the manifest: " + py_repr(name));
    }
  }
  if (!details.empty()) {
    ArtifactError error("the manifest and the archive disagree on the entries", path_,
                        kHintModified);
    error.details = std::move(details);
    throw error;
  }
}

const nlohmann::json& Archive::expected(const std::string& name) const {
  return manifest_["entries"][name];
}

namespace {
void compare(const std::string& where, const std::string& sha, uint64_t size,
             const nlohmann::json& expected) {
  const uint64_t want = expected["size"].get<uint64_t>();
  std::string what;
  if (size != want) {
    what = "entry size " + std::to_string(size) + " does not match the manifest (" +
           std::to_string(want) + ")";
  } else if (sha != expected["sha256"].get<std::string>()) {
    what = "entry SHA-256 does not match the manifest";
  } else {
    return;
  }
  throw ArtifactError(what, where, kHintModified);
}
}  // namespace

void Archive::verify_entry(const std::string& name) {
  const auto& want = expected(name);
  const uint64_t size = want["size"].get<uint64_t>();
  if (entries_.at(name).size != size) compare(where_entry(path_, name), "", entries_.at(name).size, want);
  auto [sha, got] = stream(name, size + 1, [](const unsigned char*, std::size_t) {});
  compare(where_entry(path_, name), sha, got, want);
}

std::vector<std::string> Archive::names() const {
  std::vector<std::string> out;
  for (const auto& [name, record] : manifest_["entries"].items()) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string> Archive::signature_bytes() {
  if (!entries_.count(kSignatureName)) return std::nullopt;
  std::string data;
  stream(kSignatureName, kMaxSignatureBytes + 1, [&](const unsigned char* p, std::size_t n) {
    data.append(reinterpret_cast<const char*>(p), n);
  });
  if (data.size() > kMaxSignatureBytes) {
    throw ArtifactError("entry is over 4096 bytes", where_entry(path_, kSignatureName),
                        kHintRebuild);
  }
  return data;
}

fs::path Archive::extract_private(const std::vector<std::string>& names) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/edge-artifact-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {  // mkdtemp makes it 0700
    throw Error(1, std::string("cannot make a private folder (") + std::strerror(errno) + ")",
                pattern, "check that TMPDIR is writable");
  }
  const fs::path root = fs::canonical(pattern);
  private_dirs_.push_back(root);
  for (const auto& name : names) {
    if (!manifest_["entries"].contains(name)) {
      throw ArtifactError("entry not found in the artifact", where_entry(path_, name),
                          "check the entry name, or rebuild the artifact");
    }
    copy_entry(root, name);
  }
  return root;
}

void Archive::copy_entry(const fs::path& root, const std::string& name) {
  // Names were checked at open; folders are made here one by one, never followed as links.
  fs::path target = root;
  std::size_t start = 0;
  for (std::size_t cut = name.find('/'); cut != std::string::npos; cut = name.find('/', start)) {
    target /= name.substr(start, cut - start);
    start = cut + 1;
    struct stat st {};
    if (mkdir(target.c_str(), 0700) != 0 &&
        (errno != EEXIST || lstat(target.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))) {
      throw ArtifactError("entry would be written outside the private directory",
                          where_entry(path_, name), kHintRebuild);
    }
  }
  target /= name.substr(start);
  const int fd = ::open(target.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw Error(1, std::string("cannot write a private copy (") + std::strerror(errno) + ")",
                where_entry(path_, name), "check that TMPDIR is writable and has room");
  }
  const auto& want = expected(name);
  bool failed = false;
  auto [sha, size] = stream(name, want["size"].get<uint64_t>() + 1,
                            [&](const unsigned char* p, std::size_t n) {
                              while (!failed && n > 0) {
                                const ssize_t put = ::write(fd, p, n);
                                failed = put <= 0;
                                p += put > 0 ? put : 0;
                                n -= put > 0 ? static_cast<std::size_t>(put) : 0;
                              }
                            });
  failed = ::close(fd) != 0 || failed;
  if (failed) {
    throw Error(1, "cannot write a private copy (disk full?)", where_entry(path_, name),
                "check that TMPDIR is writable and has room");
  }
  // The archive may have changed since open: trust only what was written.
  compare(where_entry(path_, name), sha, size, want);
}

}  // namespace edge
