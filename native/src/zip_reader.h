// Reading a zip through zlib's minizip (no crypto, no other codecs): the directory's records
// as they are, names decoded as Python's zipfile decodes them, entries streamed with their
// local header and CRC-32 checked. What a record means (limits, kinds, names) is for the
// callers to judge (archive.cc, npy.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace edge {

struct ZipEntry {
  std::string name;        // decoded: ASCII as is, else UTF-8 if flagged, else CP437
  std::string raw_name;    // the directory's bytes (a NUL included)
  uint64_t size = 0;       // declared, inflated
  uint64_t packed = 0;     // declared, as stored
  uint32_t method = 0;     // 0 stored, 8 deflated, others refused by the callers
  uint32_t flags = 0;      // general purpose bits (bit 0: encrypted)
  uint32_t attributes = 0; // external attributes (Unix mode in the high 16 bits)
  uint64_t dir_pos = 0;    // where minizip finds the record again
  uint64_t number = 0;
};

// Corrupt entry data found while reading (a bad local header, inflate error, CRC-32).
class ZipDataError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

class ZipReader {
 public:
  using Sink = std::function<void(const unsigned char*, std::size_t)>;
  // nullptr where minizip finds no zip (no end record, a directory it cannot place).
  static std::unique_ptr<ZipReader> open_fd(int fd);  // reads through a dup of fd
  static std::unique_ptr<ZipReader> open_path(const std::string& path);
  ~ZipReader();
  ZipReader(const ZipReader&) = delete;
  ZipReader& operator=(const ZipReader&) = delete;

  uint64_t count() const { return count_; }  // the end record's entry count
  // Every record in directory order; false where one is corrupt, a UTF-8 name is not, or
  // one needs a later zip version than zipfile reads.
  bool entries(std::vector<ZipEntry>& out);
  // Streams at most `limit` bytes of the entry into `sink`; throws ZipDataError. Short data
  // (less than the declared size, under the limit) is corrupt too.
  void read(const ZipEntry& entry, uint64_t limit, const Sink& sink);

 private:
  ZipReader(void* unz, int fd, uint64_t count) : unz_(unz), fd_(fd), count_(count) {}
  void check_local_name(const ZipEntry& entry);
  void* unz_;
  int fd_;
  uint64_t count_;
};

// A zip entry name's bytes as Python's zipfile decodes them; false if flagged UTF-8 and not.
bool decode_zip_name(const std::string& raw, bool utf8_flag, std::string& out);

}  // namespace edge
