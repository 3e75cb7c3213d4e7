#include "common/step_agent/step_cred.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* SHA-256 as FIPS 180-4 section 6.2 states it. */
static const uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

struct sha256 {
  uint32_t h[8];
  uint8_t block[64];
  size_t fill;
  uint64_t total;
};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha256_block(struct sha256* s, const uint8_t* p) {
  uint32_t w[64];
  for (int t = 0; t < 16; ++t) {
    w[t] = ((uint32_t)p[4 * t] << 24) | ((uint32_t)p[4 * t + 1] << 16) |
           ((uint32_t)p[4 * t + 2] << 8) | p[4 * t + 3];
  }
  for (int t = 16; t < 64; ++t) {
    const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3];
  uint32_t e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
  for (int t = 0; t < 64; ++t) {
    const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                        kK[t] + w[t];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  s->h[0] += a;
  s->h[1] += b;
  s->h[2] += c;
  s->h[3] += d;
  s->h[4] += e;
  s->h[5] += f;
  s->h[6] += g;
  s->h[7] += h;
}

static void sha256_init(struct sha256* s) {
  static const uint32_t kH0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, kH0, sizeof(kH0));
  s->fill = 0;
  s->total = 0;
}

static void sha256_update(struct sha256* s, const void* data, size_t len) {
  const uint8_t* p = (const uint8_t*)data;
  s->total += len;
  while (len > 0) {
    size_t take = 64 - s->fill;
    if (take > len) take = len;
    memcpy(s->block + s->fill, p, take);
    s->fill += take;
    p += take;
    len -= take;
    if (s->fill == 64) {
      sha256_block(s, s->block);
      s->fill = 0;
    }
  }
}

static void sha256_final(struct sha256* s, uint8_t out[DUET_SHA256_BYTES]) {
  const uint64_t bits = s->total * 8;
  const uint8_t one = 0x80, zero = 0;
  sha256_update(s, &one, 1);
  while (s->fill != 56) sha256_update(s, &zero, 1);
  uint8_t len_be[8];
  for (int i = 0; i < 8; ++i) len_be[i] = (uint8_t)(bits >> (56 - 8 * i));
  sha256_update(s, len_be, 8);
  for (int i = 0; i < 8; ++i) {
    out[4 * i] = (uint8_t)(s->h[i] >> 24);
    out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
    out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
    out[4 * i + 3] = (uint8_t)s->h[i];
  }
}

void duet_sha256(const void* data, size_t len, uint8_t out[DUET_SHA256_BYTES]) {
  struct sha256 s;
  sha256_init(&s);
  sha256_update(&s, data, len);
  sha256_final(&s, out);
}

void duet_hmac_sha256(const void* key, size_t key_len, const void* data, size_t len,
                      uint8_t out[DUET_SHA256_BYTES]) {
  uint8_t k[64];
  memset(k, 0, sizeof(k));
  if (key_len > 64) {
    duet_sha256(key, key_len, k);
  } else if (key_len > 0) {
    memcpy(k, key, key_len);
  }
  uint8_t pad[64];
  uint8_t inner[DUET_SHA256_BYTES];
  struct sha256 s;
  for (int i = 0; i < 64; ++i) pad[i] = k[i] ^ 0x36;
  sha256_init(&s);
  sha256_update(&s, pad, 64);
  sha256_update(&s, data, len);
  sha256_final(&s, inner);
  for (int i = 0; i < 64; ++i) pad[i] = k[i] ^ 0x5c;
  sha256_init(&s);
  sha256_update(&s, pad, 64);
  sha256_update(&s, inner, sizeof(inner));
  sha256_final(&s, out);
  memset(k, 0, sizeof(k));
  memset(pad, 0, sizeof(pad));
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
  char canonical[DUET_CRED_MAX_PAYLOAD + 64 * 24];
  if (duet_cred_canonical(method, node, job, step, gpus, n_gpus, canonical, sizeof(canonical))) {
    return -1;
  }
  uint8_t digest[DUET_SHA256_BYTES];
  duet_sha256(canonical, strlen(canonical), digest);
  char hex[2 * DUET_SHA256_BYTES + 1];
  to_hex(digest, sizeof(digest), hex);
  size_t len = 0;
  if (!APPEND("duet/v2 method=%s node=%s job=%" PRIu32, method, node, job)) return -1;
  if (step >= 0 && !APPEND(" step=%" PRIu32, (uint32_t)step)) return -1;
  if (!APPEND(" request=%s", hex)) return -1;
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
  /* A key on the stack when small (the usual), else read in pieces into the
   * HMAC's hashed form: keys over 64 bytes are hashed first (RFC 2104). */
  const size_t size = (size_t)st.st_size;
  uint8_t small[64];
  struct sha256 s;
  sha256_init(&s);
  size_t got = 0;
  while (got < size) {
    uint8_t chunk[4096];
    size_t want = size - got < sizeof(chunk) ? size - got : sizeof(chunk);
    const ssize_t n = read(fd, chunk, want);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (size <= sizeof(small)) {
      memcpy(small + got, chunk, (size_t)n);
    } else {
      sha256_update(&s, chunk, (size_t)n);
    }
    memset(chunk, 0, sizeof(chunk));
    got += (size_t)n;
  }
  close(fd);
  if (got != size) return cred_fail(err, err_len, path, "short read");
  static const char kLabel[] = "duet spank step credential v1";
  if (size <= sizeof(small)) {
    duet_hmac_sha256(small, size, kLabel, sizeof(kLabel) - 1, out);
  } else {
    uint8_t hashed[DUET_SHA256_BYTES];
    sha256_final(&s, hashed);
    duet_hmac_sha256(hashed, sizeof(hashed), kLabel, sizeof(kLabel) - 1, out);
    memset(hashed, 0, sizeof(hashed));
  }
  memset(small, 0, sizeof(small));
  memset(&s, 0, sizeof(s));
  return 0;
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
  duet_hmac_sha256(derived, DUET_SHA256_BYTES, signed_text, (size_t)sn, mac);
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
