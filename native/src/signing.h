// Ed25519 over manifest.json's exact bytes (runtime/format/signing.py): the public key is the
// PEM file `exporter keygen` writes (signing.pub), the signature the manifest.sig entry.
#pragma once

#include <string>

#include "archive.h"

namespace edge {

// Checks `archive`'s signature against the key in `public_key_path`; returns the key id.
// ArtifactError (exit 2) when unsigned, signed by another key, or not matching.
std::string verify_signature(Archive& archive, const std::string& public_key_path);

}  // namespace edge
