#include "common/credential/slurm_key_cred.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace duet::slurm_key {
namespace {

constexpr size_t kNonceBytes = 16;
constexpr size_t kMaxKeyBytes = 1 << 20;

std::string Hmac(absl::string_view key, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

constexpr size_t kMaxPayloadBytes = 1024;

std::string Signed(absl::string_view payload, int64_t unix_seconds, absl::string_view nonce) {
  return absl::StrCat(payload, "\n", unix_seconds, "\n", nonce);
}

bool IsLowerHex(absl::string_view s) {
  for (char c : s) {
    if (!absl::ascii_isdigit(c) && (c < 'a' || c > 'f')) return false;
  }
  return true;
}

}  // namespace

std::string DeriveKey(absl::string_view slurm_key) { return Hmac(slurm_key, kKeyLabel); }

std::string DefaultKeyPath(const std::string& slurm_conf) {
  std::string conf = slurm_conf;
  if (conf.empty()) {
    const char* env = std::getenv("SLURM_CONF");
    conf = env != nullptr && *env != '\0' ? env : "/etc/slurm/slurm.conf";
  }
  const size_t slash = conf.rfind('/');
  return slash == std::string::npos ? "slurm.key" : conf.substr(0, slash + 1) + "slurm.key";
}

absl::StatusOr<std::string> LoadDerivedKey(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    const std::string why = absl::StrCat("slurm.key ", path, ": ", strerror(e));
    if (e == ENOENT) return absl::NotFoundError(why);
    if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(why);
    return absl::UnavailableError(why);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("slurm.key ", path, ": not a regular file"));
  }
  if ((st.st_mode & 007) != 0) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "slurm.key ", path, ": insecure mode ", absl::StrFormat("%04o", st.st_mode & 0777),
        " (others must have no access, as Slurm requires of its keys)"));
  }
  if (st.st_size < static_cast<off_t>(kMinKeyBytes) || st.st_size > static_cast<off_t>(kMaxKeyBytes)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("slurm.key ", path, ": ", st.st_size,
                                                      " bytes; a key has ", kMinKeyBytes, " to ",
                                                      kMaxKeyBytes, " bytes"));
  }
  std::string key(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < key.size()) {
    const ssize_t n = read(fd, key.data() + got, key.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  if (got != key.size()) {
    return absl::UnavailableError(absl::StrCat("slurm.key ", path, ": short read"));
  }
  std::string derived = DeriveKey(key);
  OPENSSL_cleanse(key.data(), key.size());
  return derived;
}

absl::StatusOr<std::string> Make(absl::string_view derived_key, const std::string& payload,
                                 int64_t unix_seconds) {
  if (payload.empty() || payload.size() > kMaxPayloadBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("credential payload must have 1 to ", kMaxPayloadBytes, " bytes"));
  }
  // getrandom(2), not RAND_bytes: no OpenSSL DRBG to set up in each
  // slurmstepd (about 0.6 ms of a fresh process's first call).
  unsigned char raw[kNonceBytes];
  if (getrandom(raw, sizeof raw, 0) != static_cast<ssize_t>(sizeof raw)) {
    return absl::InternalError(absl::StrCat("no random bytes for a credential nonce: ",
                                            strerror(errno)));
  }
  const std::string nonce =
      absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(raw), sizeof raw));
  const std::string mac =
      absl::BytesToHexString(Hmac(derived_key, Signed(payload, unix_seconds, nonce)));
  return absl::StrCat(kPrefix, unix_seconds, ":", nonce, ":", absl::WebSafeBase64Escape(payload),
                      ":", mac);
}

absl::StatusOr<Parsed> Parse(absl::string_view credential) {
  if (!absl::ConsumePrefix(&credential, kPrefix)) {
    return absl::InvalidArgumentError(absl::StrCat("not a ", kPrefix, " credential"));
  }
  std::vector<absl::string_view> parts = absl::StrSplit(credential, ':');
  if (parts.size() != 4) {
    return absl::InvalidArgumentError("credential must have 4 fields after the prefix");
  }
  Parsed p;
  if (parts[0].empty() || parts[0].size() > 19 || !absl::SimpleAtoi(parts[0], &p.unix_seconds) ||
      p.unix_seconds < 0) {
    return absl::InvalidArgumentError("credential time is not a number of seconds");
  }
  if (parts[1].size() != 2 * kNonceBytes || !IsLowerHex(parts[1])) {
    return absl::InvalidArgumentError("credential nonce is not 32 hex digits");
  }
  if (parts[2].empty() || parts[2].size() > 2 * kMaxPayloadBytes ||
      !absl::WebSafeBase64Unescape(parts[2], &p.payload) || p.payload.empty() ||
      p.payload.size() > kMaxPayloadBytes) {
    return absl::InvalidArgumentError("credential payload is not base64 of 1 to 1024 bytes");
  }
  if (parts[3].size() != 64 || !IsLowerHex(parts[3])) {
    return absl::InvalidArgumentError("credential MAC is not 64 hex digits");
  }
  p.nonce = std::string(parts[1]);
  p.mac = std::string(parts[3]);
  return p;
}

bool MacMatches(absl::string_view derived_key, const Parsed& p) {
  const std::string want =
      absl::BytesToHexString(Hmac(derived_key, Signed(p.payload, p.unix_seconds, p.nonce)));
  return want.size() == p.mac.size() && CRYPTO_memcmp(want.data(), p.mac.data(), want.size()) == 0;
}

}  // namespace duet::slurm_key
