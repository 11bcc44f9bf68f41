// Signature checks, in runtime/format/signing.py's order and words.
#include "signing.h"

#include <sodium.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "backend.h"
#include "json_strict.h"
#include "sha256.h"

namespace edge {
namespace {

const char* const kKeyHint = "give the signing.pub written by `exporter keygen`";
// DER prefix of an Ed25519 SubjectPublicKeyInfo: the 32 key bytes follow.
const unsigned char kSpkiPrefix[] = {0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b,
                                     0x65, 0x70, 0x03, 0x21, 0x00};

std::string read_key_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ArtifactError(std::string("cannot read the key (") + std::strerror(errno) + ")", path);
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str().substr(0, 1 << 16);
}

// The raw 32-byte Ed25519 key of a PEM "PUBLIC KEY", or an error as signing.py words it.
std::string raw_public_key(const std::string& pem, const std::string& path) {
  const std::string begin = "-----BEGIN PUBLIC KEY-----", end = "-----END PUBLIC KEY-----";
  const std::size_t from = pem.find(begin), to = pem.find(end);
  if (from == std::string::npos || to == std::string::npos || to < from) {
    throw ArtifactError("a trusted key is not a PEM public key (no PUBLIC KEY block)", path, kKeyHint);
  }
  const std::string body = pem.substr(from + begin.size(), to - from - begin.size());
  unsigned char der[256];
  std::size_t length = 0;
  if (sodium_base642bin(der, sizeof der, body.data(), body.size(), " \t\r\n", &length, nullptr,
                        sodium_base64_VARIANT_ORIGINAL) != 0) {
    throw ArtifactError("a trusted key is not a PEM public key (bad base64)", path, kKeyHint);
  }
  if (length != sizeof kSpkiPrefix + 32 || std::memcmp(der, kSpkiPrefix, sizeof kSpkiPrefix) != 0) {
    throw ArtifactError("no Ed25519 public key to verify with", path, kKeyHint);
  }
  return std::string(reinterpret_cast<const char*>(der) + sizeof kSpkiPrefix, 32);
}

std::string key_id(const std::string& raw) {
  Sha256 hash;
  hash.update(reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
  return hash.hex().substr(0, 16);
}

}  // namespace

std::string verify_signature(Archive& archive, const std::string& public_key_path) {
  sodium_ready();
  const std::string key = raw_public_key(read_key_file(public_key_path), public_key_path);
  const std::string trusted = key_id(key);
  const std::string where = where_entry(archive.path(), kSignatureName);
  const auto signature_entry = archive.signature_bytes();
  if (!signature_entry) {
    throw ArtifactError("the artifact is not signed, and a signature is required", archive.path(),
                        "sign it with `exporter sign`");
  }
  std::string claimed, algorithm, signature_hex;
  try {
    const auto record = parse_strict_json(*signature_entry);
    claimed = record.at("key_id").get<std::string>();
    signature_hex = record.at("signature").get<std::string>();
    algorithm = record.at("algorithm").get<std::string>();
  } catch (const std::exception&) {
    throw ArtifactError("the signature entry is malformed (ValueError)", where, "sign the artifact again");
  }
  std::string signature(signature_hex.size() / 2, '\0');
  std::size_t length = 0;
  if (sodium_hex2bin(reinterpret_cast<unsigned char*>(signature.data()), signature.size(),
                     signature_hex.data(), signature_hex.size(), nullptr, &length, nullptr) != 0 ||
      length * 2 != signature_hex.size()) {
    throw ArtifactError("the signature entry is malformed (ValueError)", where, "sign the artifact again");
  }
  if (algorithm != "ed25519") {
    throw ArtifactError("the signature uses " + py_repr(algorithm) + "; only ed25519 is accepted", where,
                        "sign the artifact again with `exporter sign`");
  }
  if (claimed != trusted) {
    throw ArtifactError("signed by key " + py_repr(claimed) + ", which is not among the trusted keys (" +
                            trusted + ")", where, "add the signer's public key, or do not use this file");
  }
  const std::string& message = archive.manifest_bytes();
  if (signature.size() != crypto_sign_BYTES ||
      crypto_sign_verify_detached(reinterpret_cast<const unsigned char*>(signature.data()),
                                  reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                                  reinterpret_cast<const unsigned char*>(key.data())) != 0) {
    throw ArtifactError("the signature does not match the manifest (the artifact was changed after it "
                        "was signed)", where, "do not use this file; get it again from its signer");
  }
  return trusted;
}

}  // namespace edge
