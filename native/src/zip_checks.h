// The zip-level checks of the artifact reader that the zip library does not make (zip_checks.cc).
#pragma once

#include <cstdint>
#include <string>

namespace edge {

// The end record's entry count, directory size and offset (zip64 too), read before the zip
// library walks one record per entry; false where there is no end record (not a zip).
bool declared_directory(int fd, uint64_t file_size, uint64_t& count, uint64_t& dir_bytes,
                        uint64_t& dir_offset);
// Why `name` is not a safe entry name, or "" (runtime.format.archive._name_problem).
std::string name_problem(const std::string& name);

// Python's repr of a str, as the Python loader's messages quote names: 'a/b'.
std::string py_repr(const std::string& text);
// "PATH, entry 'NAME'", the Python loader's where.
std::string where_entry(const std::string& path, const std::string& name);

}  // namespace edge
