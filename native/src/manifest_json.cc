// Strict JSON and manifest.json's outer checks (runtime/format/manifest_json.py's twin).
#include <algorithm>
#include <set>
#include <stdexcept>
#include <vector>

#include "backend.h"
#include "json_strict.h"
#include "zip_checks.h"

namespace edge {
using nlohmann::json;
namespace {
constexpr int kMaxDepth = 1000;  // Python's json refuses deeper nesting (RecursionError)
}  // namespace

json parse_strict_json(const std::string& text) {
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) {
    throw std::invalid_argument("Unexpected UTF-8 BOM (decode using utf-8-sig)");
  }
  std::vector<std::set<std::string>> keys;  // one set per open object
  int depth = 0;
  const json::parser_callback_t check = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        [[fallthrough]];
      case json::parse_event_t::array_start:
        if (++depth > kMaxDepth) throw std::invalid_argument("nested more than 1000 levels deep");
        break;
      case json::parse_event_t::object_end:
        keys.pop_back();
        [[fallthrough]];
      case json::parse_event_t::array_end:
        --depth;
        break;
      case json::parse_event_t::key:
        // Two readers could pick different values for a duplicated key: refuse it.
        if (!keys.back().insert(parsed.get<std::string>()).second) {
          throw std::invalid_argument("duplicate key " + py_repr(parsed.get<std::string>()) + " in a JSON object");
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text, check);
  } catch (const json::exception& exc) {
    throw std::invalid_argument(exc.what());
  }
}

json parse_manifest_json(const std::string& raw, const std::string& where) {
  const char* hint = "do not use this file; rebuild the artifact with the exporter";
  const auto bad = [&](const std::string& what) { return ArtifactError(what, where, hint); };
  json manifest;
  try {
    manifest = parse_strict_json(raw);
  } catch (const std::invalid_argument& exc) {
    throw bad(std::string("manifest is not valid UTF-8 JSON (") + exc.what() + ")");
  }
  if (!manifest.is_object()) throw bad("manifest is not a JSON object");
  const json fmt = manifest.value("format", json(nullptr));
  if (!fmt.is_object() || fmt.value("name", json(nullptr)) != kFormatName) {
    throw bad(std::string("manifest format is not '") + kFormatName + "'");
  }
  const json version = fmt.value("version", json(nullptr));
  const std::string text = version.is_string() ? version.get<std::string>() : "";
  const std::size_t dot = text.find('.');
  const auto digits = [](const std::string& s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (dot == std::string::npos || !digits(text.substr(0, dot)) || !digits(text.substr(dot + 1))) {
    throw bad("manifest format version " + (version.is_string() ? py_repr(text) : version.dump()) +
              " is not 'major.minor'");
  }
  const std::string major = text.substr(0, dot);
  if (major.find_first_not_of('0') == std::string::npos ? true : major.substr(major.find_first_not_of('0')) != "1") {
    throw CompatibilityError("artifact format version " + text + " is not supported; this toolchain reads version " +
                                 kFormatVersion + " (major 1)", where,
                             "use a toolchain release that reads format " + major +
                                 ".x, or rebuild the artifact with this toolchain");
  }
  const json& entries = manifest.value("entries", json(nullptr));
  if (!manifest.contains("entries") || !manifest["entries"].is_object()) throw bad("manifest has no 'entries' object");
  for (const auto& [name, record] : manifest["entries"].items()) {
    const json sha = record.is_object() ? record.value("sha256", json(nullptr)) : json(nullptr);
    const json size = record.is_object() ? record.value("size", json(nullptr)) : json(nullptr);
    const bool sha_ok = sha.is_string() && sha.get<std::string>().size() == 64 &&
                        sha.get<std::string>().find_first_not_of("0123456789abcdef") == std::string::npos;
    const bool size_ok = size.is_number_integer() && !size.is_boolean() &&
                         (size.is_number_unsigned() || size.get<int64_t>() >= 0);
    if (!sha_ok || !size_ok) {
      throw bad("manifest record for entry " + py_repr(name) +
                " needs a lowercase hex 'sha256' and a non-negative integer 'size'");
    }
  }
  (void)entries;
  return manifest;
}

}  // namespace edge
