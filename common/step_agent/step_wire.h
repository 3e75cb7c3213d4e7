#ifndef DUET_COMMON_STEP_AGENT_STEP_WIRE_H_
#define DUET_COMMON_STEP_AGENT_STEP_WIRE_H_

/* The step agent's wire protocol: spank_duet.so in slurmstepd asks duet-node
 * (the node-local agent) to Hold or Release a Slurm step's devices, over a
 * unix socket (plugstack agent=unix:///run/duet/agent.sock). One request and
 * one reply per connection. The agent forwards the call and its credential to
 * duet-bridge on its long-lived gRPC channel; it never vouches for the step:
 * the bridge checks the credential exactly as on the gRPC path.
 *
 * Plain C, libc only: spank_duet.so links nothing else; duet-node compiles
 * the same file.
 *
 * Frame: an 8-byte header, then the body.
 *   0  u8   'D'
 *   1  u8   version, DUET_WIRE_VERSION
 *   2  u8   type, enum duet_wire_type
 *   3  u8   0
 *   4  u32  body length, big-endian, at most DUET_WIRE_MAX_BODY
 * Body: fields, each
 *   u8 tag, u16 length (big-endian), `length` bytes
 * Request fields (each at most once; node, job and, for a step, step required):
 *   1 node (1..DUET_WIRE_MAX_NODE bytes, no NUL)     2 job (u32)
 *   3 step (u32)                                     4 gpus (u32 each, at most
 *   5 credential kind (u8, enum duet_wire_cred)        DUET_WIRE_MAX_DEVICES)
 *   6 credential (1..DUET_WIRE_MAX_CRED bytes, no NUL)
 *   7 timeout_ms (u32, 1..60000)
 * Reply fields (code required; metadata repeats up to DUET_WIRE_MAX_META):
 *   1 code (u32, a google.rpc.Code)  2 reason (ErrorInfo reason, proto/README.md)
 *   3 message                        4 metadata: key, NUL, value
 * An unknown tag, a repeated field, a length over its bound, a short frame or
 * trailing bytes make the frame refused: decoding returns -1 with `err`
 * saying why and leaves the output untouched. */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DUET_WIRE_MAGIC 'D'
#define DUET_WIRE_VERSION 1u
#define DUET_WIRE_HEADER 8u
#define DUET_WIRE_MAX_BODY 16384u
#define DUET_WIRE_MAX_NODE 255u
#define DUET_WIRE_MAX_DEVICES 64u
#define DUET_WIRE_MAX_CRED 4096u
#define DUET_WIRE_MAX_REASON 63u
#define DUET_WIRE_MAX_MESSAGE 2047u
#define DUET_WIRE_MAX_META 8u
#define DUET_WIRE_MAX_META_KEY 63u
#define DUET_WIRE_MAX_META_VALUE 255u

enum duet_wire_type {
  DUET_WIRE_HOLD_STEP = 1,    /* Hold(owner=slurm_step{job, step}, gpus) */
  DUET_WIRE_RELEASE_STEP = 2, /* Release(owner=slurm_step{job, step}) */
  DUET_WIRE_RELEASE_JOB = 3,  /* Release(owner=slurm_job{job}) */
  DUET_WIRE_REPLY = 0x81,
};

enum duet_wire_cred {
  DUET_WIRE_CRED_NONE = 0,
  DUET_WIRE_CRED_MUNGE = 1,     /* gRPC metadata x-duet-munge */
  DUET_WIRE_CRED_SLURM_KEY = 2, /* gRPC metadata x-duet-slurm-key-cred */
};

struct duet_wire_request {
  uint8_t type; /* DUET_WIRE_HOLD_STEP .. DUET_WIRE_RELEASE_JOB */
  char node[DUET_WIRE_MAX_NODE + 1];
  uint32_t job_id;
  uint32_t step_id; /* not for RELEASE_JOB */
  uint32_t gpus[DUET_WIRE_MAX_DEVICES];
  uint32_t n_gpus; /* HOLD_STEP: at least 1 */
  uint8_t cred_kind;
  char cred[DUET_WIRE_MAX_CRED + 1];
  uint32_t timeout_ms; /* 0: the agent's own */
};

struct duet_wire_meta {
  char key[DUET_WIRE_MAX_META_KEY + 1];
  char value[DUET_WIRE_MAX_META_VALUE + 1];
};

struct duet_wire_reply {
  uint32_t code; /* 0 = OK */
  char reason[DUET_WIRE_MAX_REASON + 1];
  char message[DUET_WIRE_MAX_MESSAGE + 1];
  struct duet_wire_meta meta[DUET_WIRE_MAX_META];
  uint32_t n_meta;
};

/* The largest frame either side sends or accepts. */
#define DUET_WIRE_MAX_FRAME (DUET_WIRE_HEADER + DUET_WIRE_MAX_BODY)

/* Checks a header; 0 with the type and body length, or -1 with `err`. */
int duet_wire_parse_header(const uint8_t* header, size_t len, uint8_t* type,
                           uint32_t* body_len, char* err, size_t err_len);

/* Encode into `buf` (`cap` bytes); the frame's size, or -1 with `err` when a
 * value is out of bounds (nothing sent then). */
long duet_wire_encode_request(const struct duet_wire_request* r, uint8_t* buf, size_t cap,
                              char* err, size_t err_len);
long duet_wire_encode_reply(const struct duet_wire_reply* r, uint8_t* buf, size_t cap,
                            char* err, size_t err_len);

/* Decode a whole frame (header and body); 0, or -1 with `err` and `out`
 * unchanged. */
int duet_wire_decode_request(const uint8_t* frame, size_t len, struct duet_wire_request* out,
                             char* err, size_t err_len);
int duet_wire_decode_reply(const uint8_t* frame, size_t len, struct duet_wire_reply* out,
                           char* err, size_t err_len);

/* The metadata value of `key` in `r`, or NULL. */
const char* duet_wire_reply_meta(const struct duet_wire_reply* r, const char* key);

#ifdef __cplusplus
}
#endif

#endif /* DUET_COMMON_STEP_AGENT_STEP_WIRE_H_ */
