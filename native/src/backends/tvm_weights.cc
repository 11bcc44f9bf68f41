#include "backends/tvm_weights.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <utility>

#include "backend.h"

namespace edge::tvm_backend {
namespace {

namespace ffi = tvm::ffi;
using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the safetensors library's own limit
constexpr int64_t kMaxDim = int64_t{1} << 62;
const char* kRebuild = "rebuild the artifact with `exporter build`";

struct Kind {
  DLDataType dtype;
  uint64_t item_bytes;
};

// runtime/format/weights.py's ITEM_BYTES, as DLPack types (F8 has none TVM's VM takes here)
const std::map<std::string, Kind>& kinds() {
  static const std::map<std::string, Kind> table = {
      {"BOOL", {{kDLBool, 8, 1}, 1}},   {"U8", {{kDLUInt, 8, 1}, 1}},
      {"I8", {{kDLInt, 8, 1}, 1}},      {"I16", {{kDLInt, 16, 1}, 2}},
      {"U16", {{kDLUInt, 16, 1}, 2}},   {"F16", {{kDLFloat, 16, 1}, 2}},
      {"BF16", {{kDLBfloat, 16, 1}, 2}}, {"I32", {{kDLInt, 32, 1}, 4}},
      {"U32", {{kDLUInt, 32, 1}, 4}},   {"F32", {{kDLFloat, 32, 1}, 4}},
      {"I64", {{kDLInt, 64, 1}, 8}},    {"U64", {{kDLUInt, 64, 1}, 8}},
      {"F64", {{kDLFloat, 64, 1}, 8}}};
  return table;
}

struct Record {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

ArtifactError bad(const std::string& what, const std::string& where) {
  return ArtifactError("the weights file is not a valid safetensors file: " + what, where,
                       kRebuild);
}

bool small_ints(const json& values, std::size_t count, bool exact) {
  if (!values.is_array() || (exact && values.size() != count)) return false;
  return std::all_of(values.begin(), values.end(), [](const json& v) {
    return v.is_number_unsigned() && v.get<uint64_t>() < static_cast<uint64_t>(kMaxDim);
  });
}

Record parse_record(const std::string& name, const json& entry, const std::string& where) {
  if (!entry.is_object()) throw bad("tensor '" + name + "' has no record", where);
  const json& dtype = entry.contains("dtype") ? entry["dtype"] : json();
  if (!dtype.is_string() || !kinds().count(dtype.get<std::string>()))
    throw bad("tensor '" + name + "' has an unknown dtype " + dtype.dump(), where);
  const json& shape = entry.contains("shape") ? entry["shape"] : json();
  const json& offsets = entry.contains("data_offsets") ? entry["data_offsets"] : json();
  if (!small_ints(shape, 0, false)) throw bad("tensor '" + name + "' has a malformed shape", where);
  if (!small_ints(offsets, 2, true))
    throw bad("tensor '" + name + "' has malformed data_offsets", where);
  Record record{dtype.get<std::string>(), shape.get<std::vector<int64_t>>(),
                offsets[0].get<uint64_t>(), offsets[1].get<uint64_t>()};
  if (record.begin > record.end) throw bad("tensor '" + name + "' ends before it begins", where);
  // the byte count, refusing shapes whose product overflows before it is compared
  unsigned __int128 nbytes = kinds().at(record.dtype).item_bytes;
  for (int64_t dim : record.shape) {
    nbytes *= static_cast<uint64_t>(dim);
    if (nbytes > static_cast<uint64_t>(kMaxDim)) nbytes = static_cast<uint64_t>(kMaxDim) + 1;
  }
  if (nbytes != record.end - record.begin)
    throw bad("tensor '" + name + "' spans " + std::to_string(record.end - record.begin) +
                  " bytes, not the size of its dtype and shape",
              where);
  return record;
}

// name -> record, in name order, after checking that the ranges tile the data exactly.
std::map<std::string, Record> read_header(std::ifstream& in, uint64_t size, uint64_t& data_start,
                                          const std::string& where) {
  unsigned char head[8];
  if (size < 8 || !in.read(reinterpret_cast<char*>(head), 8))
    throw bad("the file is shorter than a safetensors header", where);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | head[i];  // little-endian
  if (length > std::min(kMaxHeaderBytes, size - 8))
    throw bad("the header claims " + std::to_string(length) + " bytes in a " +
                  std::to_string(size) + "-byte file (not a safetensors file: a pickle, or truncated?)",
              where);
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  json header = json::parse(text, nullptr, false);
  if (header.is_discarded()) throw bad("the header is not UTF-8 JSON", where);
  if (!header.is_object()) throw bad("the header is not a JSON object", where);
  std::map<std::string, Record> records;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    Record record = parse_record(name, entry, where);
    ranges.emplace_back(record.begin, record.end);
    records.emplace(name, std::move(record));
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t cursor = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != cursor) throw bad("the tensors' byte ranges overlap or leave gaps", where);
    cursor = end;
  }
  data_start = 8 + length;
  if (cursor != size - data_start)
    throw bad("the tensors cover " + std::to_string(cursor) + " bytes; the file holds " +
                  std::to_string(size - data_start) + " after the header",
              where);
  return records;
}

// What differs between the file's index and the manifest's, as load_checked lists it.
std::vector<std::string> index_problems(const std::map<std::string, Record>& found,
                                        const json& expected) {
  std::vector<std::string> problems;
  for (const auto& [name, record] : found) {
    if (!expected.contains(name)) {
      problems.push_back("'" + name + "' is in the file, not in the manifest");
      continue;
    }
    json has = json::array({record.dtype, record.shape});
    if (expected[name] != has)
      problems.push_back("'" + name + "': the manifest says " + expected[name].dump().substr(0, 80) +
                         ", the file has " + has.dump());
  }
  for (const auto& [name, _] : expected.items())
    if (!found.count(name)) problems.push_back("'" + name + "' is in the manifest, not in the file");
  return problems;
}

}  // namespace

void AlignedAlloc::AllocData(DLTensor* tensor) {
  std::size_t size = (ffi::GetDataSize(*tensor) + 63) / 64 * 64;
  tensor->data = std::aligned_alloc(64, size == 0 ? 64 : size);
  if (tensor->data == nullptr) throw std::bad_alloc();
}

void AlignedAlloc::FreeData(DLTensor* tensor) { std::free(tensor->data); }

ffi::Tensor empty_tensor(const std::vector<int64_t>& shape, DLDataType dtype) {
  return ffi::Tensor::FromNDAlloc(AlignedAlloc(), ffi::Shape(shape), dtype, DLDevice{kDLCPU, 0});
}

std::vector<ffi::Tensor> load_checked(const std::filesystem::path& path, const json& expected,
                                      const std::string& where) {
  if (!expected.is_object())
    throw ArtifactError("the manifest has no index of this weights file", where, kRebuild);
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  uint64_t size = std::filesystem::file_size(path, ec);
  if (!in || ec) throw ArtifactError("the weights file cannot be opened", where, kRebuild);
  uint64_t data_start = 0;
  std::map<std::string, Record> records = read_header(in, size, data_start, where);
  std::vector<std::string> problems = index_problems(records, expected);
  if (!problems.empty()) {
    std::string what = "the weights file does not match the manifest's index: " + problems[0];
    if (problems.size() > 1) what += " (and " + std::to_string(problems.size() - 1) + " more)";
    throw ArtifactError(what, where, kRebuild);
  }
  std::vector<ffi::Tensor> tensors;
  for (const auto& [name, record] : records) {
    ffi::Tensor tensor = empty_tensor(record.shape, kinds().at(record.dtype).dtype);
    in.seekg(static_cast<std::streamoff>(data_start + record.begin));
    if (!in.read(static_cast<char*>(tensor.data_ptr()),
                 static_cast<std::streamsize>(record.end - record.begin)))
      throw ArtifactError("the weights cannot be read: tensor '" + name + "' is cut short", where,
                          kRebuild);
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

}  // namespace edge::tvm_backend
