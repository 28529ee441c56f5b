// Challenge–response over the deployment secret (HMAC-SHA256, OpenSSL).
// Each side proves it holds the secret over both nonces, so neither a
// replayed hello nor a listener that does not know the secret passes.
// Private to transport/ucx.
#pragma once

#include <cstdint>
#include <string_view>

#include "transport/ucx/control_wire.h"

namespace baton::transport::ucx {

[[nodiscard]] Result<Nonce> random_nonce();
[[nodiscard]] Result<std::uint64_t> random_token();

// The initiator's proof: over the listener's nonce, its own, and what it says
// of itself (its name and worker address).
[[nodiscard]] Proof initiator_proof(std::string_view secret, const Nonce& listener_nonce,
                                    const Nonce& initiator_nonce, std::string_view name);
// The listener's proof, over the same nonces the other way round.
[[nodiscard]] Proof listener_proof(std::string_view secret, const Nonce& listener_nonce,
                                   const Nonce& initiator_nonce);
// Constant time.
[[nodiscard]] bool same_proof(const Proof& a, const Proof& b);

}  // namespace baton::transport::ucx
