// Opens a zip (libzip), hashes "abc" (libsodium SHA-256), prints both as JSON (nlohmann).
#include <zip.h>
#include <sodium.h>
#include <nlohmann/json.hpp>
#include <cstdio>
int main(int argc, char** argv) {
  if (sodium_init() < 0) return 3;
  unsigned char h[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(h, (const unsigned char*)"abc", 3);
  int err = 0;
  zip_t* z = zip_open(argc > 1 ? argv[1] : "/nonexistent.zip", ZIP_RDONLY, &err);
  nlohmann::json j = {{"sha0", h[0]}, {"zip_opened", z != nullptr}, {"libzip", zip_libzip_version()}};
  if (z) { j["entries"] = zip_get_num_entries(z, 0); zip_close(z); }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
