#include "transport/ucx/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "baton/common/file_path.h"
#include "baton/transport/secret.h"

namespace baton::transport {

Result<std::string> read_secret_file(const std::string& path) {
  if (Status s = check_file_path("secret file", path); !s.is_ok()) return std::unexpected(s);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return std::unexpected(Status::not_found("secret file {}: {}", path, std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return std::unexpected(Status::invalid_argument("secret file {}: not a regular file", path));
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return std::unexpected(Status::invalid_argument(
        "secret file {}: mode {:o} lets other users read or change it (chmod 600 {})", path, st.st_mode & 0777, path));
  }
  if (st.st_size > static_cast<off_t>(kMaxSecretBytes + 1)) {
    return std::unexpected(Status::invalid_argument("secret file {}: {} bytes (at most {})", path, st.st_size,
                                                    kMaxSecretBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::unexpected(Status::not_found("secret file {}: cannot open it", path));
  std::string secret((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!secret.empty() && secret.back() == '\n') secret.pop_back();
  if (secret.size() < kMinSecretBytes || secret.size() > kMaxSecretBytes) {
    return std::unexpected(Status::invalid_argument("secret file {}: the secret has {} bytes (expected {}..{})", path,
                                                    secret.size(), kMinSecretBytes, kMaxSecretBytes));
  }
  return secret;
}

namespace ucx {
namespace {

Proof hmac(std::string_view secret, std::string_view label, std::span<const std::uint8_t> a,
           std::span<const std::uint8_t> b, std::string_view tail) {
  std::vector<std::uint8_t> message(label.begin(), label.end());
  message.insert(message.end(), a.begin(), a.end());
  message.insert(message.end(), b.begin(), b.end());
  message.insert(message.end(), tail.begin(), tail.end());
  Proof out{};
  unsigned int length = 0;
  // An empty secret (loopback without one) still yields a proof both sides
  // agree on, so a side that has one and a side that does not fail to meet.
  static const char kEmpty = 0;
  HMAC(EVP_sha256(), secret.empty() ? &kEmpty : secret.data(), static_cast<int>(secret.size()), message.data(),
       message.size(), out.data(), &length);
  return out;
}

// No entropy means no authentication: the caller refuses the connection.
Status random_bytes(std::uint8_t* out, std::size_t n) {
  if (RAND_bytes(out, static_cast<int>(n)) != 1) {
    return Status::unavailable("control channel: OpenSSL has no random bytes to give (RAND_bytes failed)");
  }
  return Status::ok();
}

}  // namespace

Result<Nonce> random_nonce() {
  Nonce n{};
  if (Status s = random_bytes(n.data(), n.size()); !s.is_ok()) return std::unexpected(s);
  return n;
}

Result<std::uint64_t> random_token() {
  std::uint64_t t = 0;
  if (Status s = random_bytes(reinterpret_cast<std::uint8_t*>(&t), sizeof t); !s.is_ok()) return std::unexpected(s);
  return t;
}

Proof initiator_proof(std::string_view secret, const Nonce& listener_nonce, const Nonce& initiator_nonce,
                      std::string_view name) {
  return hmac(secret, "baton-initiator", listener_nonce, initiator_nonce, name);
}

Proof listener_proof(std::string_view secret, const Nonce& listener_nonce, const Nonce& initiator_nonce) {
  return hmac(secret, "baton-listener", initiator_nonce, listener_nonce, {});
}

bool same_proof(const Proof& a, const Proof& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

}  // namespace ucx
}  // namespace baton::transport
