#include "common/step_agent/step_wire.h"

#include <stdio.h>
#include <string.h>

enum {
  TAG_NODE = 1,
  TAG_JOB = 2,
  TAG_STEP = 3,
  TAG_GPUS = 4,
  TAG_CRED_KIND = 5,
  TAG_CRED = 6,
  TAG_TIMEOUT = 7,
  TAG_CODE = 1,
  TAG_REASON = 2,
  TAG_MESSAGE = 3,
  TAG_META = 4,
};

static int fail(char* err, size_t err_len, const char* why) {
  if (err_len > 0) snprintf(err, err_len, "step agent frame refused: %s", why);
  return -1;
}

static void put_u16(uint8_t* p, uint32_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}

static void put_u32(uint8_t* p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

static uint32_t get_u16(const uint8_t* p) { return ((uint32_t)p[0] << 8) | p[1]; }

static uint32_t get_u32(const uint8_t* p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* An encoder over a caller's buffer; `ok` drops to 0 when it is full. */
struct writer {
  uint8_t* buf;
  size_t cap;
  size_t len;
  int ok;
};

static void put_field(struct writer* w, uint8_t tag, const void* data, size_t n) {
  if (!w->ok || n > 0xffff || w->len + 3 + n > w->cap) {
    w->ok = 0;
    return;
  }
  w->buf[w->len] = tag;
  put_u16(w->buf + w->len + 1, (uint32_t)n);
  if (n) memcpy(w->buf + w->len + 3, data, n);
  w->len += 3 + n;
}

static void put_u32_field(struct writer* w, uint8_t tag, uint32_t v) {
  uint8_t b[4];
  put_u32(b, v);
  put_field(w, tag, b, 4);
}

static long finish(struct writer* w, uint8_t type, char* err, size_t err_len) {
  const size_t body = w->len - DUET_WIRE_HEADER;
  if (!w->ok || body > DUET_WIRE_MAX_BODY) return fail(err, err_len, "larger than the buffer");
  w->buf[0] = DUET_WIRE_MAGIC;
  w->buf[1] = DUET_WIRE_VERSION;
  w->buf[2] = type;
  w->buf[3] = 0;
  put_u32(w->buf + 4, (uint32_t)body);
  return (long)w->len;
}

static int string_ok(const char* s, size_t max) {
  const size_t n = strnlen(s, max + 1);
  return n >= 1 && n <= max;
}

int duet_wire_parse_header(const uint8_t* h, size_t len, uint8_t* type, uint32_t* body_len,
                           char* err, size_t err_len) {
  if (len < DUET_WIRE_HEADER) return fail(err, err_len, "shorter than its 8-byte header");
  if (h[0] != DUET_WIRE_MAGIC) return fail(err, err_len, "not a duet step agent frame");
  if (h[1] != DUET_WIRE_VERSION) {
    char why[96];
    snprintf(why, sizeof(why), "version %u, this build speaks %u (spank_duet and duet-node differ)",
             h[1], DUET_WIRE_VERSION);
    return fail(err, err_len, why);
  }
  if (h[3] != 0) return fail(err, err_len, "reserved header byte is not 0");
  const uint32_t n = get_u32(h + 4);
  if (n > DUET_WIRE_MAX_BODY) return fail(err, err_len, "body longer than 16384 bytes");
  *type = h[2];
  *body_len = n;
  return 0;
}

long duet_wire_encode_request(const struct duet_wire_request* r, uint8_t* buf, size_t cap,
                              char* err, size_t err_len) {
  if (r->type < DUET_WIRE_HOLD_STEP || r->type > DUET_WIRE_RELEASE_JOB) {
    return fail(err, err_len, "unknown request type");
  }
  if (!string_ok(r->node, DUET_WIRE_MAX_NODE)) return fail(err, err_len, "node name length");
  if (r->type == DUET_WIRE_HOLD_STEP && (r->n_gpus < 1 || r->n_gpus > DUET_WIRE_MAX_DEVICES)) {
    return fail(err, err_len, "a hold names 1 to 64 GPUs");
  }
  if (r->cred_kind > DUET_WIRE_CRED_SLURM_KEY) return fail(err, err_len, "credential kind");
  if (r->cred_kind != DUET_WIRE_CRED_NONE && !string_ok(r->cred, DUET_WIRE_MAX_CRED)) {
    return fail(err, err_len, "credential length");
  }
  if (r->timeout_ms > 60000) return fail(err, err_len, "timeout_ms over 60000");
  if (cap < DUET_WIRE_HEADER) return fail(err, err_len, "larger than the buffer");
  struct writer w = {buf, cap, DUET_WIRE_HEADER, 1};
  put_field(&w, TAG_NODE, r->node, strlen(r->node));
  put_u32_field(&w, TAG_JOB, r->job_id);
  if (r->type != DUET_WIRE_RELEASE_JOB) put_u32_field(&w, TAG_STEP, r->step_id);
  if (r->type == DUET_WIRE_HOLD_STEP) {
    uint8_t g[4 * DUET_WIRE_MAX_DEVICES];
    for (uint32_t i = 0; i < r->n_gpus; ++i) put_u32(g + 4 * i, r->gpus[i]);
    put_field(&w, TAG_GPUS, g, 4 * (size_t)r->n_gpus);
  }
  if (r->cred_kind != DUET_WIRE_CRED_NONE) {
    put_field(&w, TAG_CRED_KIND, &r->cred_kind, 1);
    put_field(&w, TAG_CRED, r->cred, strlen(r->cred));
  }
  if (r->timeout_ms) put_u32_field(&w, TAG_TIMEOUT, r->timeout_ms);
  return finish(&w, r->type, err, err_len);
}

long duet_wire_encode_reply(const struct duet_wire_reply* r, uint8_t* buf, size_t cap,
                            char* err, size_t err_len) {
  if (strnlen(r->reason, DUET_WIRE_MAX_REASON + 1) > DUET_WIRE_MAX_REASON ||
      strnlen(r->message, DUET_WIRE_MAX_MESSAGE + 1) > DUET_WIRE_MAX_MESSAGE ||
      r->n_meta > DUET_WIRE_MAX_META) {
    return fail(err, err_len, "reply field over its bound");
  }
  if (cap < DUET_WIRE_HEADER) return fail(err, err_len, "larger than the buffer");
  struct writer w = {buf, cap, DUET_WIRE_HEADER, 1};
  put_u32_field(&w, TAG_CODE, r->code);
  if (r->reason[0]) put_field(&w, TAG_REASON, r->reason, strlen(r->reason));
  if (r->message[0]) put_field(&w, TAG_MESSAGE, r->message, strlen(r->message));
  for (uint32_t i = 0; i < r->n_meta; ++i) {
    const size_t k = strnlen(r->meta[i].key, DUET_WIRE_MAX_META_KEY + 1);
    const size_t v = strnlen(r->meta[i].value, DUET_WIRE_MAX_META_VALUE + 1);
    if (k < 1 || k > DUET_WIRE_MAX_META_KEY || v > DUET_WIRE_MAX_META_VALUE) {
      return fail(err, err_len, "metadata over its bound");
    }
    uint8_t kv[DUET_WIRE_MAX_META_KEY + 1 + DUET_WIRE_MAX_META_VALUE];
    memcpy(kv, r->meta[i].key, k);
    kv[k] = 0;
    memcpy(kv + k + 1, r->meta[i].value, v);
    put_field(&w, TAG_META, kv, k + 1 + v);
  }
  return finish(&w, DUET_WIRE_REPLY, err, err_len);
}

/* Iterates over a body's fields. */
struct reader {
  const uint8_t* p;
  const uint8_t* end;
};

/* 1 with the next field, 0 at the end, -1 when a field runs past the body. */
static int next_field(struct reader* rd, uint8_t* tag, const uint8_t** data, uint32_t* n) {
  if (rd->p == rd->end) return 0;
  if (rd->end - rd->p < 3) return -1;
  *tag = rd->p[0];
  *n = get_u16(rd->p + 1);
  if ((size_t)(rd->end - rd->p - 3) < *n) return -1;
  *data = rd->p + 3;
  rd->p += 3 + *n;
  return 1;
}

/* Copies a string field of 1..max bytes without NUL into dst (max + 1). */
static int copy_string(char* dst, const uint8_t* data, uint32_t n, uint32_t max, int may_be_empty) {
  if ((n == 0 && !may_be_empty) || n > max || memchr(data, 0, n) != NULL) return -1;
  memcpy(dst, data, n);
  dst[n] = 0;
  return 0;
}

static int open_frame(const uint8_t* frame, size_t len, uint8_t* type, struct reader* rd,
                      char* err, size_t err_len) {
  uint32_t body = 0;
  if (duet_wire_parse_header(frame, len, type, &body, err, err_len) != 0) return -1;
  if (len != DUET_WIRE_HEADER + (size_t)body) {
    return fail(err, err_len, "length differs from its header's");
  }
  rd->p = frame + DUET_WIRE_HEADER;
  rd->end = frame + len;
  return 0;
}

int duet_wire_decode_request(const uint8_t* frame, size_t len, struct duet_wire_request* out,
                             char* err, size_t err_len) {
  uint8_t type = 0;
  struct reader rd;
  if (open_frame(frame, len, &type, &rd, err, err_len) != 0) return -1;
  if (type < DUET_WIRE_HOLD_STEP || type > DUET_WIRE_RELEASE_JOB) {
    return fail(err, err_len, "not a request type");
  }
  struct duet_wire_request r;
  memset(&r, 0, sizeof(r));
  r.type = type;
  unsigned seen = 0;
  uint8_t tag = 0;
  const uint8_t* d = NULL;
  uint32_t n = 0;
  int more;
  while ((more = next_field(&rd, &tag, &d, &n)) == 1) {
    if (tag < TAG_NODE || tag > TAG_TIMEOUT) return fail(err, err_len, "unknown field");
    if (seen & (1u << tag)) return fail(err, err_len, "a field repeats");
    seen |= 1u << tag;
    switch (tag) {
      case TAG_NODE:
        if (copy_string(r.node, d, n, DUET_WIRE_MAX_NODE, 0)) {
          return fail(err, err_len, "node must be 1 to 255 bytes without NUL");
        }
        break;
      case TAG_JOB:
      case TAG_STEP:
      case TAG_TIMEOUT:
        if (n != 4) return fail(err, err_len, "job, step and timeout_ms are 4 bytes");
        if (tag == TAG_JOB) r.job_id = get_u32(d);
        if (tag == TAG_STEP) r.step_id = get_u32(d);
        if (tag == TAG_TIMEOUT) r.timeout_ms = get_u32(d);
        break;
      case TAG_GPUS:
        if (n == 0 || n % 4 != 0 || n / 4 > DUET_WIRE_MAX_DEVICES) {
          return fail(err, err_len, "gpus must be 1 to 64 4-byte indices");
        }
        r.n_gpus = n / 4;
        for (uint32_t i = 0; i < r.n_gpus; ++i) r.gpus[i] = get_u32(d + 4 * i);
        break;
      case TAG_CRED_KIND:
        if (n != 1 || d[0] < DUET_WIRE_CRED_MUNGE || d[0] > DUET_WIRE_CRED_SLURM_KEY) {
          return fail(err, err_len, "unknown credential kind");
        }
        r.cred_kind = d[0];
        break;
      case TAG_CRED:
        if (copy_string(r.cred, d, n, DUET_WIRE_MAX_CRED, 0)) {
          return fail(err, err_len, "credential must be 1 to 4096 bytes without NUL");
        }
        break;
    }
  }
  if (more < 0) return fail(err, err_len, "a field runs past the body");
  if (!(seen & (1u << TAG_NODE)) || !(seen & (1u << TAG_JOB))) {
    return fail(err, err_len, "node and job are required");
  }
  const int step_given = (seen & (1u << TAG_STEP)) != 0;
  if (step_given != (type != DUET_WIRE_RELEASE_JOB)) {
    return fail(err, err_len, "a step is named by step requests only");
  }
  if ((type == DUET_WIRE_HOLD_STEP) != ((seen & (1u << TAG_GPUS)) != 0)) {
    return fail(err, err_len, "gpus are named by a hold only, and always");
  }
  if (((seen >> TAG_CRED_KIND) & 1u) != ((seen >> TAG_CRED) & 1u)) {
    return fail(err, err_len, "credential and its kind come together");
  }
  if ((seen & (1u << TAG_TIMEOUT)) && (r.timeout_ms < 1 || r.timeout_ms > 60000)) {
    return fail(err, err_len, "timeout_ms must be 1..60000");
  }
  memcpy(out, &r, sizeof(r));
  return 0;
}

int duet_wire_decode_reply(const uint8_t* frame, size_t len, struct duet_wire_reply* out,
                           char* err, size_t err_len) {
  uint8_t type = 0;
  struct reader rd;
  if (open_frame(frame, len, &type, &rd, err, err_len) != 0) return -1;
  if (type != DUET_WIRE_REPLY) return fail(err, err_len, "not a reply");
  struct duet_wire_reply r;
  memset(&r, 0, sizeof(r));
  unsigned seen = 0;
  uint8_t tag = 0;
  const uint8_t* d = NULL;
  uint32_t n = 0;
  int more;
  while ((more = next_field(&rd, &tag, &d, &n)) == 1) {
    if (tag < TAG_CODE || tag > TAG_META) return fail(err, err_len, "unknown field");
    if (tag != TAG_META && (seen & (1u << tag))) return fail(err, err_len, "a field repeats");
    seen |= 1u << tag;
    switch (tag) {
      case TAG_CODE:
        if (n != 4) return fail(err, err_len, "code is 4 bytes");
        r.code = get_u32(d);
        if (r.code > 16) return fail(err, err_len, "code is not a google.rpc.Code");
        break;
      case TAG_REASON:
        if (copy_string(r.reason, d, n, DUET_WIRE_MAX_REASON, 0)) {
          return fail(err, err_len, "reason must be 1 to 63 bytes without NUL");
        }
        break;
      case TAG_MESSAGE:
        if (copy_string(r.message, d, n, DUET_WIRE_MAX_MESSAGE, 0)) {
          return fail(err, err_len, "message must be 1 to 2047 bytes without NUL");
        }
        break;
      case TAG_META: {
        if (r.n_meta >= DUET_WIRE_MAX_META) return fail(err, err_len, "more than 8 metadata");
        const uint8_t* nul = n ? memchr(d, 0, n) : NULL;
        if (nul == NULL) return fail(err, err_len, "metadata is key, NUL, value");
        const uint32_t k = (uint32_t)(nul - d);
        struct duet_wire_meta* m = &r.meta[r.n_meta];
        if (copy_string(m->key, d, k, DUET_WIRE_MAX_META_KEY, 0) ||
            copy_string(m->value, nul + 1, n - k - 1, DUET_WIRE_MAX_META_VALUE, 1)) {
          return fail(err, err_len, "metadata key 1 to 63 bytes, value at most 255");
        }
        ++r.n_meta;
        break;
      }
    }
  }
  if (more < 0) return fail(err, err_len, "a field runs past the body");
  if (!(seen & (1u << TAG_CODE))) return fail(err, err_len, "code is required");
  memcpy(out, &r, sizeof(r));
  return 0;
}

const char* duet_wire_reply_meta(const struct duet_wire_reply* r, const char* key) {
  for (uint32_t i = 0; i < r->n_meta && i < DUET_WIRE_MAX_META; ++i) {
    if (strcmp(r->meta[i].key, key) == 0) return r->meta[i].value;
  }
  return NULL;
}
