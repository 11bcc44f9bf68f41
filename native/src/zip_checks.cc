// What the artifact reader checks of the zip's end record before the zip library reads the
// directory (its declared size), the entry-name rules shared with runtime/format/archive.py,
// and names quoted as Python's repr quotes them.
#include "zip_checks.h"

#include <unistd.h>

#include <algorithm>
#include <vector>

namespace edge {
namespace {

uint64_t le(const unsigned char* p, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

}  // namespace

// The end-of-central-directory record's entry count and directory size (zip64 too), read
// before the zip library walks one record per entry, so a huge declared directory costs nothing.
// Returns false where there is no end record (not a zip).
bool declared_directory(int fd, uint64_t file_size, uint64_t& count, uint64_t& dir_bytes,
                        uint64_t& dir_offset) {
  const uint64_t tail = std::min<uint64_t>(file_size, 22 + 65535);
  std::vector<unsigned char> buf(tail);
  if (tail < 22 || pread(fd, buf.data(), tail, file_size - tail) != static_cast<ssize_t>(tail)) {
    return false;
  }
  for (int64_t at = static_cast<int64_t>(tail) - 22; at >= 0; --at) {
    const unsigned char* p = buf.data() + at;
    if (le(p, 4) != 0x06054b50) continue;
    count = le(p + 10, 2);
    dir_bytes = le(p + 12, 4);
    dir_offset = le(p + 16, 4);
    const uint64_t eocd_at = file_size - tail + at;
    if ((count == 0xffff || dir_bytes == 0xffffffff) && eocd_at >= 20) {
      unsigned char loc[20], rec[56];
      if (pread(fd, loc, 20, eocd_at - 20) == 20 && le(loc, 4) == 0x07064b50 &&
          pread(fd, rec, 56, le(loc + 8, 8)) == 56 && le(rec, 4) == 0x06064b50) {
        count = le(rec + 32, 8);
        dir_bytes = le(rec + 40, 8);
        dir_offset = le(rec + 48, 8);
      }
    }
    return true;
  }
  return false;
}

// Why `name` is not a safe entry name, or "" (runtime.format.archive._name_problem).
std::string name_problem(const std::string& name) {
  if (name.empty()) return "empty name";
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f) return "contains a NUL or control character";
  }
  if (name.find('\\') != std::string::npos) return "contains a backslash";
  if (name[0] == '/') return "is an absolute path";
  if (name.find(':') != std::string::npos) return "contains ':' (drive letter or stream name)";
  std::size_t start = 0;
  while (true) {
    const std::size_t end = name.find('/', start);
    const std::string part = name.substr(start, end == std::string::npos ? end : end - start);
    if (part.empty() || part == "." || part == "..") {
      return "has an empty, '.' or '..' path component (" + py_repr(part) + ")";
    }
    if (part.size() > 255) return "has a path component longer than 255 bytes";
    if (end == std::string::npos) return "";
    start = end + 1;
  }
}

std::string py_repr(const std::string& text) {
  const bool single = text.find('\'') != std::string::npos && text.find('"') == std::string::npos;
  const char quote = single ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : text) {
    if (c == '\\' || c == quote) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : "";
      if (c != '\n' && c != '\t' && c != '\r') {
        out += "\\x";
        out += hex[c >> 4];
        out += hex[c & 15];
      }
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + quote;
}

std::string where_entry(const std::string& path, const std::string& name) {
  return path + ", entry " + py_repr(name);
}

}  // namespace edge
