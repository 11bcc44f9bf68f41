// The zip library's side of reading an artifact or an .npz: zlib's minizip, which needs
// nothing but zlib (libzip would bring OpenSSL, bzip2 and xz into every native bundle).
#include "zip_reader.h"

#include <fcntl.h>
#include <unistd.h>
#include <unzip.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace edge {
namespace {

constexpr std::size_t kChunk = 1 << 20;
constexpr uint32_t kUtf8Flag = 0x800;  // general purpose bit 11: the name is UTF-8
constexpr uint32_t kMaxExtractVersion = 63;  // zipfile refuses zips that need a later one

// Python's cp437 codec, bytes 0x80-0xff (what zipfile decodes unflagged names with).
constexpr uint16_t kCp437High[128] = {
    0x00c7, 0x00fc, 0x00e9, 0x00e2, 0x00e4, 0x00e0, 0x00e5, 0x00e7,
    0x00ea, 0x00eb, 0x00e8, 0x00ef, 0x00ee, 0x00ec, 0x00c4, 0x00c5,
    0x00c9, 0x00e6, 0x00c6, 0x00f4, 0x00f6, 0x00f2, 0x00fb, 0x00f9,
    0x00ff, 0x00d6, 0x00dc, 0x00a2, 0x00a3, 0x00a5, 0x20a7, 0x0192,
    0x00e1, 0x00ed, 0x00f3, 0x00fa, 0x00f1, 0x00d1, 0x00aa, 0x00ba,
    0x00bf, 0x2310, 0x00ac, 0x00bd, 0x00bc, 0x00a1, 0x00ab, 0x00bb,
    0x2591, 0x2592, 0x2593, 0x2502, 0x2524, 0x2561, 0x2562, 0x2556,
    0x2555, 0x2563, 0x2551, 0x2557, 0x255d, 0x255c, 0x255b, 0x2510,
    0x2514, 0x2534, 0x252c, 0x251c, 0x2500, 0x253c, 0x255e, 0x255f,
    0x255a, 0x2554, 0x2569, 0x2566, 0x2560, 0x2550, 0x256c, 0x2567,
    0x2568, 0x2564, 0x2565, 0x2559, 0x2558, 0x2552, 0x2553, 0x256b,
    0x256a, 0x2518, 0x250c, 0x2588, 0x2584, 0x258c, 0x2590, 0x2580,
    0x03b1, 0x00df, 0x0393, 0x03c0, 0x03a3, 0x03c3, 0x00b5, 0x03c4,
    0x03a6, 0x0398, 0x03a9, 0x03b4, 0x221e, 0x03c6, 0x03b5, 0x2229,
    0x2261, 0x00b1, 0x2265, 0x2264, 0x2320, 0x2321, 0x00f7, 0x2248,
    0x00b0, 0x2219, 0x00b7, 0x221a, 0x207f, 0x00b2, 0x25a0, 0x00a0,
};

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// Strict UTF-8 as Python's decoder takes it: no overlong forms, surrogates or > U+10FFFF.
bool valid_utf8(const std::string& text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    std::size_t more = 0;
    uint32_t cp = 0, least = 0;
    if (lead < 0x80) {
      ++i;
      continue;
    } else if ((lead & 0xe0) == 0xc0) {
      more = 1, cp = lead & 0x1f, least = 0x80;
    } else if ((lead & 0xf0) == 0xe0) {
      more = 2, cp = lead & 0x0f, least = 0x800;
    } else if ((lead & 0xf8) == 0xf0) {
      more = 3, cp = lead & 0x07, least = 0x10000;
    } else {
      return false;
    }
    if (i + more >= text.size()) return false;
    for (std::size_t k = 1; k <= more; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (next & 0x3f);
    }
    if (cp < least || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += more + 1;
  }
  return true;
}

// minizip's default stdio functions, opened on a dup of the caller's descriptor (never by
// path again: the file checked is the file read).
voidpf open_descriptor(voidpf opaque, const void*, int) {
  const int fd = fcntl(static_cast<int>(reinterpret_cast<intptr_t>(opaque)), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return nullptr;
  FILE* file = fdopen(fd, "rb");
  if (file == nullptr) ::close(fd);
  return file;
}

std::string read_problem(int code) {
  switch (code) {
    case UNZ_ERRNO: return "read error";
    case Z_DATA_ERROR: return "invalid compressed data";
    case Z_BUF_ERROR: return "compressed data ends early";
    case Z_MEM_ERROR: return "out of memory while inflating";
    default: return "minizip error " + std::to_string(code);
  }
}

}  // namespace

bool decode_zip_name(const std::string& raw, bool utf8_flag, std::string& out) {
  if (std::all_of(raw.begin(), raw.end(), [](char c) { return (c & 0x80) == 0; })) {
    out = raw;
    return true;
  }
  if (utf8_flag) {
    out = raw;
    return valid_utf8(raw);
  }
  out.clear();
  for (unsigned char c : raw) append_utf8(out, c < 0x80 ? c : kCp437High[c - 0x80]);
  return true;
}

std::unique_ptr<ZipReader> ZipReader::open_fd(int fd) {
  const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return nullptr;
  zlib_filefunc64_def io;
  fill_fopen64_filefunc(&io);
  io.zopen64_file = open_descriptor;
  io.opaque = reinterpret_cast<voidpf>(static_cast<intptr_t>(own));
  unzFile unz = unzOpen2_64("", &io);
  unz_global_info64 info{};
  if (unz != nullptr && unzGetGlobalInfo64(unz, &info) == UNZ_OK) {
    return std::unique_ptr<ZipReader>(new ZipReader(unz, own, info.number_entry));
  }
  if (unz != nullptr) unzClose(unz);
  ::close(own);
  return nullptr;
}

std::unique_ptr<ZipReader> ZipReader::open_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  auto reader = open_fd(fd);
  ::close(fd);
  return reader;
}

ZipReader::~ZipReader() {
  unzClose(unz_);
  ::close(fd_);
}

bool ZipReader::entries(std::vector<ZipEntry>& out) {
  if (count_ == 0) return true;
  if (unzGoToFirstFile(unz_) != UNZ_OK) return false;
  std::vector<char> name(1 << 16);  // a name's length is a 16-bit field
  for (uint64_t i = 0; i < count_; ++i) {
    unz_file_info64 info{};
    unz64_file_pos pos{};
    if ((i > 0 && unzGoToNextFile(unz_) != UNZ_OK) ||
        unzGetCurrentFileInfo64(unz_, &info, name.data(), name.size(), nullptr, 0, nullptr, 0) !=
            UNZ_OK ||
        unzGetFilePos64(unz_, &pos) != UNZ_OK ||
        (info.version_needed & 0xff) > kMaxExtractVersion) {
      return false;
    }
    ZipEntry entry;
    entry.raw_name.assign(name.data(), std::min<std::size_t>(info.size_filename, name.size()));
    if (!decode_zip_name(entry.raw_name, info.flag & kUtf8Flag, entry.name)) return false;
    entry.size = info.uncompressed_size;
    entry.packed = info.compressed_size;
    entry.method = static_cast<uint32_t>(info.compression_method);
    entry.flags = static_cast<uint32_t>(info.flag);
    entry.attributes = static_cast<uint32_t>(info.external_fa);
    entry.dir_pos = pos.pos_in_zip_directory;
    entry.number = pos.num_of_file;
    out.push_back(std::move(entry));
  }
  return true;
}

// minizip compares the local header's name length only; zipfile compares the bytes.
void ZipReader::check_local_name(const ZipEntry& entry) {
  const uint64_t data_at = unzGetCurrentFileZStreamPos64(unz_);
  const int extra = unzGetLocalExtrafield(unz_, nullptr, 0);
  const uint64_t length = entry.raw_name.size();
  std::string local(length, '\0');
  if (extra < 0 || data_at < static_cast<uint64_t>(extra) + length ||
      pread(fd_, local.data(), length, static_cast<off_t>(data_at - extra - length)) !=
          static_cast<ssize_t>(length) ||
      local != entry.raw_name) {
    throw ZipDataError("the local header names another file than the directory");
  }
}

void ZipReader::read(const ZipEntry& entry, uint64_t limit, const Sink& sink) {
  const unz64_file_pos pos{entry.dir_pos, entry.number};
  if (unzGoToFilePos64(unz_, &pos) != UNZ_OK) {
    throw ZipDataError("its directory record is unreadable");
  }
  if (unzOpenCurrentFile(unz_) != UNZ_OK) {
    throw ZipDataError("its local header does not match the directory");
  }
  struct Closer {
    void* unz;
    ~Closer() { unzCloseCurrentFile(unz); }  // a no-op once closed below
  } closer{unz_};
  check_local_name(entry);
  std::vector<unsigned char> chunk(kChunk);
  uint64_t total = 0;
  while (limit > 0) {
    const int got = unzReadCurrentFile(unz_, chunk.data(),
                                       static_cast<unsigned>(std::min<uint64_t>(kChunk, limit)));
    if (got < 0) throw ZipDataError(read_problem(got));
    if (got == 0) break;
    sink(chunk.data(), static_cast<std::size_t>(got));
    total += static_cast<uint64_t>(got);
    limit -= static_cast<uint64_t>(got);
  }
  if (unzCloseCurrentFile(unz_) == UNZ_CRCERROR) throw ZipDataError("Bad CRC-32");
  if (limit > 0 && total < entry.size) throw ZipDataError("the data ends before its size");
}

}  // namespace edge
