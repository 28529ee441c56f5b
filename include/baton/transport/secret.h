// The deployment secret engines prove to each other before any region or
// remote key is sent (docs/security.md). Every engine of a deployment holds
// the same one; it never travels, only HMAC proofs of it do.
#pragma once

#include <string>

#include "baton/common/status.h"

namespace baton::transport {

// At least this many bytes: a guessable secret protects nothing.
inline constexpr std::size_t kMinSecretBytes = 16;
inline constexpr std::size_t kMaxSecretBytes = 4096;

// The secret in `path`, without one trailing newline. not_found when the
// file cannot be read; invalid_argument when it is shorter than 16 or longer
// than 4096 bytes, or readable or writable by other users (chmod 600).
[[nodiscard]] Result<std::string> read_secret_file(const std::string& path);

}  // namespace baton::transport
