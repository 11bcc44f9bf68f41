// SHA-256 through libsodium, streamed; hex digests as the manifest writes them.
#pragma once

#include <sodium.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace edge {

inline void sodium_ready() {
  static const bool ready = sodium_init() >= 0;
  if (!ready) throw std::runtime_error("libsodium failed to initialise");
}

class Sha256 {
 public:
  Sha256() {
    sodium_ready();
    crypto_hash_sha256_init(&state_);
  }
  void update(const unsigned char* data, std::size_t size) {
    crypto_hash_sha256_update(&state_, data, size);
  }
  std::string hex() {
    unsigned char digest[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_final(&state_, digest);
    char out[crypto_hash_sha256_BYTES * 2 + 1];
    sodium_bin2hex(out, sizeof out, digest, sizeof digest);
    return out;
  }

 private:
  crypto_hash_sha256_state state_;
};

}  // namespace edge
