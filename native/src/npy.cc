// The npy format (numpy/lib/format.py): magic, version, a little header dict, raw data.
#include "npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>  // minizip's writer

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "zip_reader.h"

namespace edge {
namespace {

constexpr uint64_t kMaxArrayBytes = 8ull << 30;  // runtime.host.tensorio.MAX_INPUT_BYTES
constexpr uint64_t kMaxArrays = 4096;  // as runtime/host/tensorio.py
constexpr uint64_t kMaxHeader = 65536 + 12;  // an .npy's magic, version and header
const char* const kHint = "write the inputs with numpy.savez (C-order, little-endian arrays of "
                          "float32, float16, float64, int8, uint8, int16, int32, int64 or bool)";

// numpy's descr for each dtype ('<' little-endian; '|' for single bytes). No bfloat16 in numpy.
const std::map<std::string, DType>& descrs() {
  static const std::map<std::string, DType> table = {
      {"<f4", DType::float32}, {"<f2", DType::float16}, {"<f8", DType::float64},
      {"|i1", DType::int8},    {"|u1", DType::uint8},   {"<i2", DType::int16},
      {"<i4", DType::int32},   {"<i8", DType::int64},   {"|b1", DType::bool_}};
  return table;
}

std::string descr_of(DType dtype) {
  for (const auto& [descr, d] : descrs()) {
    if (d == dtype) return descr;
  }
  throw ArtifactError(std::string("numpy has no dtype for ") + dtype_name(dtype), "",
                      "this output cannot be written as .npz");
}

// The header dict, exactly as numpy writes it: {'descr': '<f4', 'fortran_order': False,
// 'shape': (2, 3), } with any order of the three keys and trailing spaces and newline.
struct Header {
  std::string descr;
  bool fortran = false;
  std::vector<int64_t> shape;
};

struct Cursor {
  const std::string& text;
  std::size_t at = 0;
  void spaces() { while (at < text.size() && text[at] == ' ') ++at; }
  bool eat(const std::string& token) {
    spaces();
    if (text.compare(at, token.size(), token) != 0) return false;
    at += token.size();
    return true;
  }
  std::string quoted() {
    spaces();
    if (at >= text.size() || text[at] != '\'') throw std::invalid_argument("expected a quoted string");
    const std::size_t end = text.find('\'', at + 1);
    if (end == std::string::npos) throw std::invalid_argument("unterminated string");
    std::string value = text.substr(at + 1, end - at - 1);
    at = end + 1;
    return value;
  }
  int64_t integer() {
    spaces();
    std::size_t start = at;
    while (at < text.size() && text[at] >= '0' && text[at] <= '9' && at - start < 18) ++at;
    if (at == start || (at < text.size() && text[at] >= '0' && text[at] <= '9')) {
      throw std::invalid_argument("expected a dimension");
    }
    return std::stoll(text.substr(start, at - start));
  }
};

Header parse_header(const std::string& text) {
  Cursor c{text};
  Header h;
  bool seen_descr = false, seen_order = false, seen_shape = false;
  if (!c.eat("{")) throw std::invalid_argument("the header is not a dict");
  while (!c.eat("}")) {
    const std::string key = c.quoted();
    if (!c.eat(":")) throw std::invalid_argument("expected ':'");
    if (key == "descr" && !seen_descr) {
      seen_descr = true;
      h.descr = c.quoted();
    } else if (key == "fortran_order" && !seen_order) {
      seen_order = true;
      if (c.eat("True")) h.fortran = true;
      else if (!c.eat("False")) throw std::invalid_argument("fortran_order is not True or False");
    } else if (key == "shape" && !seen_shape) {
      seen_shape = true;
      if (!c.eat("(")) throw std::invalid_argument("shape is not a tuple");
      while (!c.eat(")")) {
        h.shape.push_back(c.integer());
        if (!c.eat(",") && !(c.spaces(), c.at < text.size() && text[c.at] == ')')) {
          throw std::invalid_argument("shape is not a tuple of integers");
        }
      }
    } else {
      throw std::invalid_argument("unexpected or repeated key '" + key + "'");
    }
    if (!c.eat(",") && !(c.spaces(), c.at < text.size() && text[c.at] == '}')) {
      throw std::invalid_argument("expected ',' between keys");
    }
  }
  while (c.at < text.size() && (text[c.at] == ' ' || text[c.at] == '\n')) ++c.at;
  if (c.at != text.size() || !seen_descr || !seen_order || !seen_shape) {
    throw std::invalid_argument("the header needs exactly descr, fortran_order and shape");
  }
  return h;
}

// The file's first `limit` bytes; with `whole`, a file over `limit` is refused instead.
std::string read_file(const std::string& path, uint64_t limit, bool whole) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  struct stat st {};
  if (fd < 0) {
    throw ArtifactError(std::string("cannot open the inputs file (") + std::strerror(errno) + ")", path,
                        "check the path and its permissions");
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ArtifactError("the inputs file is not a regular file", path, "pass an .npz or .npy file");
  }
  if (whole && static_cast<uint64_t>(st.st_size) > limit) {
    ::close(fd);
    throw ArtifactError("the array is more than " + std::to_string(limit) +
                        " bytes, the most these inputs can take", path, kHint);
  }
  std::string data(std::min<std::size_t>(static_cast<std::size_t>(st.st_size), limit), '\0');
  std::size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd, data.data() + got, data.size() - got);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  data.resize(got);
  return data;
}

NamedTensors read_npz(const std::string& path, uint64_t max_bytes) {
  auto archive = ZipReader::open_path(path);
  if (!archive) throw ArtifactError("not a valid .npz file (truncated or not a zip)", path, kHint);
  if (archive->count() > kMaxArrays) {
    throw ArtifactError("the .npz holds more than " + std::to_string(kMaxArrays) + " arrays", path, kHint);
  }
  std::vector<ZipEntry> entries;
  if (!archive->entries(entries)) throw ArtifactError("the .npz is corrupt", path, kHint);
  NamedTensors out;
  uint64_t total = 0, i = 0;
  for (const auto& entry : entries) {
    const std::string& name = entry.name;
    const std::string where = path + ", array " + name;
    if (name.size() < 5 || name.compare(name.size() - 4, 4, ".npy") != 0 || name.find('/') != std::string::npos) {
      throw ArtifactError("the .npz entry " + name + " is not an array file (NAME.npy)", path, kHint);
    }
    total += entry.size;
    if (total > max_bytes + (++i) * kMaxHeader) {  // checked from the directory, before inflating
      throw ArtifactError("the arrays add up to more than " + std::to_string(max_bytes) +
                          " bytes, the most these inputs can take (at " + name + ")", path, kHint);
    }
    std::string bytes;
    bytes.reserve(static_cast<std::size_t>(entry.size));
    try {
      archive->read(entry, entry.size, [&](const unsigned char* data, std::size_t n) {
        bytes.append(reinterpret_cast<const char*>(data), n);
      });
    } catch (const ZipDataError&) {
      throw ArtifactError("the array's data is corrupt or truncated", where, kHint);
    }
    const std::string array = name.substr(0, name.size() - 4);
    for (const auto& [seen, tensor] : out) {
      if (seen == array) throw ArtifactError("the .npz holds two arrays named " + array, path, kHint);
    }
    out.emplace_back(array, parse_npy(bytes, where));
  }
  return out;
}

// Adds one stored (uncompressed) entry, as numpy.savez writes them; false on a write error.
bool add_stored(zipFile archive, const std::string& name, const std::string& data) {
  zip_fileinfo info{};
  info.tmz_date.tm_mday = 1;  // 1980-01-01, the zip format's first day
  info.tmz_date.tm_year = 1980;
  const int zip64 = data.size() >= 0xffffffffull;
  if (zipOpenNewFileInZip4_64(archive, name.c_str(), &info, nullptr, 0, nullptr, 0, nullptr,
                              0, 0, 0, -MAX_WBITS, DEF_MEM_LEVEL, Z_DEFAULT_STRATEGY, nullptr, 0,
                              0, 0x800 /* UTF-8 name */, zip64) != ZIP_OK) {
    return false;
  }
  bool ok = true;
  for (std::size_t at = 0; ok && at < data.size(); at += 1u << 30) {
    const auto n = static_cast<unsigned>(std::min<std::size_t>(data.size() - at, 1u << 30));
    ok = zipWriteInFileInZip(archive, data.data() + at, n) == ZIP_OK;
  }
  return zipCloseFileInZip(archive) == ZIP_OK && ok;
}

}  // namespace

Tensor parse_npy(const std::string& bytes, const std::string& where) {
  const auto bad = [&](const std::string& what) { return ArtifactError(what, where, kHint); };
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) throw bad("not an .npy array (no NUMPY magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  std::size_t length = 0, start = 0;
  const auto byte = [&](std::size_t i) { return static_cast<std::size_t>(static_cast<unsigned char>(bytes[i])); };
  if (major == 1) {
    length = byte(8) | byte(9) << 8;
    start = 10;
  } else if ((major == 2 || major == 3) && bytes.size() >= 12) {
    length = byte(8) | byte(9) << 8 | byte(10) << 16 | byte(11) << 24;
    start = 12;
  } else {
    throw bad("unknown .npy format version " + std::to_string(major));
  }
  if (length > 65536 || start + length > bytes.size()) throw bad("the .npy header is truncated");
  Header header;
  try {
    header = parse_header(bytes.substr(start, length));
  } catch (const std::invalid_argument& exc) {
    throw bad(std::string("the .npy header is malformed (") + exc.what() + ")");
  }
  if (header.descr.find('O') != std::string::npos) throw bad("object arrays are refused (they need pickle)");
  if (!header.descr.empty() && header.descr[0] == '>') throw bad("big-endian arrays are refused (dtype " + header.descr + ")");
  auto dtype = descrs().find(header.descr);
  if (dtype == descrs().end()) throw bad("unsupported array dtype '" + header.descr + "'");
  if (header.fortran) throw bad("Fortran-order arrays are refused (save a C-order copy)");
  Tensor tensor;
  tensor.dtype = dtype->second;
  tensor.shape = header.shape;
  uint64_t nbytes = dtype_size(tensor.dtype);
  for (int64_t d : header.shape) {
    if (d > 0 && nbytes > kMaxArrayBytes / static_cast<uint64_t>(d)) throw bad("the array is over 8 GiB");
    nbytes *= static_cast<uint64_t>(d);
  }
  const uint64_t data = bytes.size() - start - length;
  if (data != nbytes) {
    throw bad("the array holds " + std::to_string(data) + " data bytes, its header says " +
              std::to_string(nbytes) + (data < nbytes ? " (truncated)" : ""));
  }
  const auto* p = reinterpret_cast<const std::byte*>(bytes.data() + start + length);
  tensor.bytes.assign(p, p + nbytes);
  return tensor;
}

std::string npy_bytes(const Tensor& tensor) {
  std::string shape;
  for (int64_t d : tensor.shape) shape += std::to_string(d) + ", ";
  if (tensor.shape.size() > 1) shape.erase(shape.size() - 2);
  else if (tensor.shape.size() == 1) shape.erase(shape.size() - 1);
  std::string header = "{'descr': '" + descr_of(tensor.dtype) + "', 'fortran_order': False, 'shape': (" +
                       shape + "), }";
  header.append(63 - (10 + header.size()) % 64, ' ');  // data starts 64-byte aligned
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(tensor.bytes.data()), tensor.bytes.size());
  return out;
}

NamedTensors read_arrays(const std::string& path, const std::string& single_name, uint64_t max_bytes) {
  max_bytes = std::min(max_bytes, kMaxArrayBytes);
  const std::string head = read_file(path, 6, false);
  if (head != "\x93NUMPY") return read_npz(path, max_bytes);
  const std::string data = read_file(path, max_bytes + kMaxHeader, true);
  NamedTensors out;
  out.emplace_back(single_name, parse_npy(data, path + ", array " + single_name));
  return out;
}

// The file `path` names, a symbolic link followed (as the Python runtime does). Only a
// regular file is replaced: a rename over a FIFO or /dev/null would replace the node itself.
static std::string output_target(const std::string& path) {
  char resolved[PATH_MAX];
  std::string target = ::realpath(path.c_str(), resolved) ? resolved : path;
  struct stat st {};
  if (target == path && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {  // dangling
    const ssize_t n = ::readlink(path.c_str(), resolved, sizeof resolved - 1);
    const std::string link(resolved, n > 0 ? n : 0), slash = path.substr(0, path.rfind('/') + 1);
    if (!link.empty()) target = link[0] == '/' ? link : slash + link;
  }
  if (::stat(target.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    throw ArtifactError("the outputs file exists and is not a regular file; only a regular file is ever replaced",
                        path, "give a file name for --out");
  }
  return target;
}

void write_npz(const std::string& out, const NamedTensors& tensors) {
  const std::string path = output_target(out);
  std::string temp = path + ".tmp-XXXXXX";
  const int fd = mkstemp(temp.data());
  if (fd < 0) {
    throw ArtifactError(std::string("cannot write the outputs (") + std::strerror(errno) + ")", path,
                        "check that the folder exists and is writable");
  }
  ::close(fd);
  zipFile archive = zipOpen64(temp.c_str(), APPEND_STATUS_CREATE);
  bool ok = archive != nullptr;
  for (const auto& [name, tensor] : tensors) {
    ok = ok && add_stored(archive, name + ".npy", npy_bytes(tensor));
  }
  ok = archive != nullptr && zipClose(archive, nullptr) == ZIP_OK && ok;
  if (!ok) {
    std::remove(temp.c_str());
    throw ArtifactError("cannot write the outputs", path, "check that the folder is writable and has room");
  }
  ::chmod(temp.c_str(), 0644);
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    throw ArtifactError(std::string("cannot write the outputs (") + std::strerror(errno) + ")", path,
                        "check that the folder is writable");
  }
}

}  // namespace edge
