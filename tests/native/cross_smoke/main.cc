// Opens a zip (minizip), hashes "abc" (libsodium SHA-256), prints both as JSON (nlohmann).
#include <unzip.h>
#include <sodium.h>
#include <nlohmann/json.hpp>
#include <cstdio>
int main(int argc, char** argv) {
  if (sodium_init() < 0) return 3;
  unsigned char h[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(h, (const unsigned char*)"abc", 3);
  unzFile z = unzOpen64(argc > 1 ? argv[1] : "/nonexistent.zip");
  nlohmann::json j = {{"sha0", h[0]}, {"zip_opened", z != nullptr}};
  unz_global_info64 info{};
  if (z && unzGetGlobalInfo64(z, &info) == UNZ_OK) j["entries"] = info.number_entry;
  if (z) unzClose(z);
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
