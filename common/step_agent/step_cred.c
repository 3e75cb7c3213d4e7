#include "common/step_agent/step_cred.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* SHA-256 and HMAC-SHA256 are the system libcrypto's (OpenSSL 3), opened
 * with dlopen on first use, so spank_duet.so itself links libc only. In the
 * slurmstepd of an auth/slurm cluster (Slinky, the GKE add-on) libcrypto is
 * already mapped (auth_slurm.so links it through libjwt): opening it there
 * finds it. Only the slurm.key credential opens it: a munge credential's
 * duet/v3 payload needs no hashing. The handle is kept: slurmstepd is
 * short-lived and libcrypto is not unloaded under its other users.
 *
 * Two interfaces of it, the first found wins:
 *   - "sha256": the digest's own SHA256_Init/Update/Final, with HMAC built
 *     on them as RFC 2104 gives it. They run the digest and nothing else.
 *   - "evp": EVP_Digest and HMAC. In OpenSSL 3 their first call in a
 *     process initialises the library and its default provider and fetches
 *     the algorithm: about 2-3 ms, paid by every step, since each step is
 *     a fresh slurmstepd (bench/slurm/RESULTS.md). Kept for a libcrypto
 *     built without the deprecated digest functions. */
typedef int (*sha256_init_fn)(void* ctx);
typedef int (*sha256_update_fn)(void* ctx, const void* data, size_t len);
typedef int (*sha256_final_fn)(unsigned char* md, void* ctx);
typedef const void* (*evp_md_fn)(void);
typedef int (*evp_digest_fn)(const void* data, size_t count, unsigned char* md,
                             unsigned int* size, const void* type, void* impl);
typedef unsigned char* (*hmac_fn)(const void* md, const void* key, int key_len,
                                  const unsigned char* data, size_t data_len, unsigned char* out,
                                  unsigned int* out_len);

/* OpenSSL 3's SHA256_CTX is 112 bytes (8 + 2 + 16 words, 2 ints); room to spare. */
typedef union {
  unsigned char bytes[256];
  uint64_t align;
} sha256_ctx;

static struct {
  sha256_init_fn init;
  sha256_update_fn update;
  sha256_final_fn final;
  evp_md_fn sha256;
  evp_digest_fn digest;
  hmac_fn hmac;
  int prefer_evp;
  char error[160];
} crypto;
static pthread_once_t crypto_once = PTHREAD_ONCE_INIT;

static void crypto_open(void) {
  static const char* const kNames[] = {"libcrypto.so.3", "libcrypto.so"};
  void* h = NULL;
  for (size_t i = 0; h == NULL && i < sizeof(kNames) / sizeof(kNames[0]); ++i) {
    h = dlopen(kNames[i], RTLD_LAZY | RTLD_LOCAL);
  }
  if (h == NULL) {
    const char* why = dlerror();
    snprintf(crypto.error, sizeof(crypto.error), "libcrypto (SHA-256) not loadable: %s",
             why != NULL ? why : "not found");
    return;
  }
  crypto.init = (sha256_init_fn)dlsym(h, "SHA256_Init");
  crypto.update = (sha256_update_fn)dlsym(h, "SHA256_Update");
  crypto.final = (sha256_final_fn)dlsym(h, "SHA256_Final");
  if (crypto.init == NULL || crypto.update == NULL || crypto.final == NULL) {
    crypto.init = NULL;
  }
  crypto.sha256 = (evp_md_fn)dlsym(h, "EVP_sha256");
  crypto.digest = (evp_digest_fn)dlsym(h, "EVP_Digest");
  crypto.hmac = (hmac_fn)dlsym(h, "HMAC");
  if (crypto.sha256 == NULL || crypto.digest == NULL || crypto.hmac == NULL) {
    crypto.sha256 = NULL;
  }
  if (crypto.init == NULL && crypto.sha256 == NULL) {
    snprintf(crypto.error, sizeof(crypto.error),
             "libcrypto lacks both SHA256_Init/Update/Final and EVP_sha256, EVP_Digest, HMAC");
  }
}

/* 1: the digest's own functions; 0: EVP; -1 with `err` set: neither. */
static int crypto_ready(char* err, size_t err_len) {
  pthread_once(&crypto_once, crypto_open);
  if (crypto.init != NULL && !(crypto.prefer_evp && crypto.sha256 != NULL)) return 1;
  if (crypto.sha256 != NULL) return 0;
  if (err != NULL && err_len > 0) snprintf(err, err_len, "%s", crypto.error);
  return -1;
}

const char* duet_crypto_interface(void) {
  switch (crypto_ready(NULL, 0)) {
    case 1:
      return "sha256";
    case 0:
      return "evp";
    default:
      return "none";
  }
}

void duet_crypto_prefer_evp(int on) {
  pthread_once(&crypto_once, crypto_open);
  crypto.prefer_evp = on != 0;
}

/* SHA-256 over the concatenation of up to two pieces, with the digest's own
 * functions. */
static int direct_sha256(const void* a, size_t a_len, const void* b, size_t b_len,
                         uint8_t out[DUET_SHA256_BYTES]) {
  sha256_ctx ctx;
  const int ok = crypto.init(&ctx) == 1 && crypto.update(&ctx, a, a_len) == 1 &&
                 (b_len == 0 || crypto.update(&ctx, b, b_len) == 1) &&
                 crypto.final(out, &ctx) == 1;
  explicit_bzero(&ctx, sizeof(ctx));
  return ok ? 0 : -1;
}

int duet_sha256(const void* data, size_t len, uint8_t out[DUET_SHA256_BYTES], char* err,
                size_t err_len) {
  const int path = crypto_ready(err, err_len);
  if (path < 0) return -1;
  if (path == 1) {
    if (direct_sha256(data, len, NULL, 0, out) == 0) return 0;
    snprintf(err, err_len, "SHA-256 failed in libcrypto");
    return -1;
  }
  unsigned int n = 0;
  if (crypto.digest(data, len, out, &n, crypto.sha256(), NULL) != 1 || n != DUET_SHA256_BYTES) {
    snprintf(err, err_len, "SHA-256 failed in libcrypto");
    return -1;
  }
  return 0;
}

/* RFC 2104 with SHA-256 (block 64 bytes): a key longer than a block is
 * hashed first, then zero-padded to a block;
 * HMAC = H((K ^ opad) || H((K ^ ipad) || data)). */
static int direct_hmac_sha256(const void* key, size_t key_len, const void* data, size_t len,
                              uint8_t out[DUET_SHA256_BYTES]) {
  enum { kBlock = 64 };
  uint8_t k[kBlock] = {0};
  uint8_t pad[kBlock];
  uint8_t inner[DUET_SHA256_BYTES];
  int rc = 0;
  if (key_len > kBlock) {
    rc = direct_sha256(key, key_len, NULL, 0, k);
  } else if (key_len > 0) {
    memcpy(k, key, key_len);
  }
  if (rc == 0) {
    for (size_t i = 0; i < kBlock; ++i) pad[i] = k[i] ^ 0x36;
    rc = direct_sha256(pad, kBlock, data, len, inner);
  }
  if (rc == 0) {
    for (size_t i = 0; i < kBlock; ++i) pad[i] = k[i] ^ 0x5c;
    rc = direct_sha256(pad, kBlock, inner, sizeof(inner), out);
  }
  explicit_bzero(k, sizeof(k));
  explicit_bzero(pad, sizeof(pad));
  explicit_bzero(inner, sizeof(inner));
  return rc;
}

int duet_hmac_sha256(const void* key, size_t key_len, const void* data, size_t len,
                     uint8_t out[DUET_SHA256_BYTES], char* err, size_t err_len) {
  const int path = crypto_ready(err, err_len);
  if (path < 0) return -1;
  if (path == 1) {
    if (direct_hmac_sha256(key, key_len, data, len, out) == 0) return 0;
    snprintf(err, err_len, "HMAC-SHA256 failed in libcrypto");
    return -1;
  }
  unsigned int n = 0;
  if (key_len > (size_t)INT_MAX ||
      crypto.hmac(crypto.sha256(), key, (int)key_len, (const unsigned char*)data, len, out, &n) ==
          NULL ||
      n != DUET_SHA256_BYTES) {
    snprintf(err, err_len, "HMAC-SHA256 failed in libcrypto");
    return -1;
  }
  return 0;
}

static void to_hex(const uint8_t* b, size_t n, char* out) {
  static const char kDigits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[b[i] >> 4];
    out[2 * i + 1] = kDigits[b[i] & 15];
  }
  out[2 * n] = 0;
}

/* After snprintf wrote `n` bytes at *len of a `cap`-byte buffer: -1 when
 * they did not fit. */
static int append(size_t cap, size_t* len, int n) {
  if (n < 0 || (size_t)n >= cap - *len) return -1;
  *len += (size_t)n;
  return 0;
}

#define APPEND(...) \
  (append(cap, &len, snprintf(out + len, cap - len, __VA_ARGS__)) == 0)

int duet_cred_canonical(const char* method, const char* node, uint32_t job, int64_t step,
                        const uint32_t* gpus, size_t n_gpus, char* out, size_t cap) {
  const int hold = strcmp(method, "Hold") == 0;
  if ((!hold && strcmp(method, "Release") != 0) || (hold && step < 0) || cap == 0) return -1;
  size_t len = 0;
  if (!APPEND("%s node=%zu:%s owner=", method, strlen(node), node)) return -1;
  if (step >= 0) {
    if (!APPEND("slurm_step:%" PRIu32 ".%" PRIu32, job, (uint32_t)step)) return -1;
  } else if (!APPEND("slurm_job:%" PRIu32, job)) {
    return -1;
  }
  if (hold) {
    if (!APPEND(" devices=")) return -1;
    for (size_t i = 0; i < n_gpus; ++i) {
      /* DEVICE_KIND_GPU = 1, milli 0 (a whole device). */
      if (!APPEND("%s1:%" PRIu32 ":0", i ? "," : "", gpus[i])) return -1;
    }
    if (!APPEND(" generation=0")) return -1;
  }
  return 0;
}

int duet_cred_payload(const char* method, const char* node, uint32_t job, int64_t step,
                      const uint32_t* gpus, size_t n_gpus, char* out, size_t cap) {
  /* At most the DUET_CRED_MAX_PAYLOAD bytes a slurm.key credential signs. */
  static const char kVersion[] = "duet/v3 ";
  const size_t n = sizeof(kVersion) - 1;
  char text[DUET_CRED_MAX_PAYLOAD + 1];
  memcpy(text, kVersion, n);
  if (duet_cred_canonical(method, node, job, step, gpus, n_gpus, text + n, sizeof(text) - n)) {
    return -1;
  }
  const size_t len = strlen(text);
  if (len >= cap) return -1;
  memcpy(out, text, len + 1);
  return 0;
}

static int cred_fail(char* err, size_t err_len, const char* path, const char* why) {
  snprintf(err, err_len, "slurm.key %s: %s", path, why);
  return -1;
}

int duet_cred_slurm_key_derive(const char* path, uint8_t out[DUET_SHA256_BYTES], char* err,
                               size_t err_len) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return cred_fail(err, err_len, path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return cred_fail(err, err_len, path, "not a regular file");
  }
  if ((st.st_mode & 007) != 0) {
    close(fd);
    char why[128];
    snprintf(why, sizeof(why),
             "insecure mode %04o (others must have no access, as Slurm requires of its keys)",
             (unsigned)(st.st_mode & 0777));
    return cred_fail(err, err_len, path, why);
  }
  enum { kMin = 16, kMax = 1 << 20 };
  if (st.st_size < kMin || st.st_size > kMax) {
    close(fd);
    char why[96];
    snprintf(why, sizeof(why), "%lld bytes; a key has %d to %d bytes", (long long)st.st_size,
             kMin, kMax);
    return cred_fail(err, err_len, path, why);
  }
  /* The whole key in memory (at most 1 MiB), wiped after use. HMAC hashes
   * a key over 64 bytes first (RFC 2104), as the gRPC client's does. */
  const size_t size = (size_t)st.st_size;
  uint8_t* key = malloc(size);
  if (key == NULL) {
    close(fd);
    return cred_fail(err, err_len, path, "out of memory");
  }
  size_t got = 0;
  while (got < size) {
    const ssize_t n = read(fd, key + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  close(fd);
  static const char kLabel[] = "duet spank step credential v1";
  int rc = -1;
  if (got != size) {
    cred_fail(err, err_len, path, "short read");
  } else {
    rc = duet_hmac_sha256(key, size, kLabel, sizeof(kLabel) - 1, out, err, err_len);
  }
  explicit_bzero(key, size);
  free(key);
  return rc;
}

/* Web-safe base64 without padding (RFC 4648 section 5). */
static size_t base64url(const uint8_t* in, size_t n, char* out) {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  size_t o = 0;
  size_t i = 0;
  for (; i + 3 <= n; i += 3) {
    const uint32_t v = ((uint32_t)in[i] << 16) | ((uint32_t)in[i + 1] << 8) | in[i + 2];
    out[o++] = kAlphabet[(v >> 18) & 63];
    out[o++] = kAlphabet[(v >> 12) & 63];
    out[o++] = kAlphabet[(v >> 6) & 63];
    out[o++] = kAlphabet[v & 63];
  }
  if (n - i == 1) {
    const uint32_t v = (uint32_t)in[i] << 16;
    out[o++] = kAlphabet[(v >> 18) & 63];
    out[o++] = kAlphabet[(v >> 12) & 63];
  } else if (n - i == 2) {
    const uint32_t v = ((uint32_t)in[i] << 16) | ((uint32_t)in[i + 1] << 8);
    out[o++] = kAlphabet[(v >> 18) & 63];
    out[o++] = kAlphabet[(v >> 12) & 63];
    out[o++] = kAlphabet[(v >> 6) & 63];
  }
  out[o] = 0;
  return o;
}

int duet_cred_slurm_key_make(const uint8_t derived[DUET_SHA256_BYTES], const char* payload,
                             int64_t unix_seconds, const uint8_t nonce[16], char* out,
                             size_t cap, char* err, size_t err_len) {
  const size_t plen = strlen(payload);
  if (plen == 0 || plen > DUET_CRED_MAX_PAYLOAD) {
    snprintf(err, err_len, "credential payload must have 1 to %u bytes", DUET_CRED_MAX_PAYLOAD);
    return -1;
  }
  char nonce_hex[33];
  to_hex(nonce, 16, nonce_hex);
  char signed_text[DUET_CRED_MAX_PAYLOAD + 64];
  const int sn = snprintf(signed_text, sizeof(signed_text), "%s\n%" PRId64 "\n%s", payload,
                          unix_seconds, nonce_hex);
  uint8_t mac[DUET_SHA256_BYTES];
  if (duet_hmac_sha256(derived, DUET_SHA256_BYTES, signed_text, (size_t)sn, mac, err, err_len)) {
    return -1;
  }
  char mac_hex[2 * DUET_SHA256_BYTES + 1];
  to_hex(mac, sizeof(mac), mac_hex);
  char b64[(DUET_CRED_MAX_PAYLOAD + 2) / 3 * 4 + 1];
  base64url((const uint8_t*)payload, plen, b64);
  const int n = snprintf(out, cap, "duet-key2:%" PRId64 ":%s:%s:%s", unix_seconds, nonce_hex, b64,
                         mac_hex);
  if (n < 0 || (size_t)n >= cap) {
    snprintf(err, err_len, "credential longer than %zu bytes", cap);
    return -1;
  }
  return 0;
}
