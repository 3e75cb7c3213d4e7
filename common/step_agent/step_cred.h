#ifndef DUET_COMMON_STEP_AGENT_STEP_CRED_H_
#define DUET_COMMON_STEP_AGENT_STEP_CRED_H_

/* The credential of a Slurm step's Hold/Release, made in plain C for the
 * agent path of spank_duet.so (common/step_agent/step_wire.h), byte for byte
 * what the gRPC client makes and duet-bridge checks:
 *   - the canonical request text (common/credential/request_digest.h),
 *   - the duet/v3 payload (common/credential/munge_payload.h),
 *   - the slurm.key credential "duet-key2:..." (common/credential/slurm_key_cred.h).
 * The munge credential is munge_encode of the payload (libmunge, which
 * spank_duet.so dlopens: slurmstepd of an auth/munge cluster has it loaded);
 * it needs no hashing, so a munge cluster's step loads no libcrypto.
 *
 * SHA-256 and HMAC-SHA256 are the system libcrypto's, opened with dlopen on
 * first use (already mapped in slurmstepd on auth/slurm clusters, through
 * auth_slurm.so; only the slurm.key credential opens it), so that the plugin links
 * libc only and carries no cryptography of its own. It calls the digest's
 * own functions (SHA256_Init/Update/Final), not EVP, whose first call in each
 * fresh slurmstepd initialises OpenSSL's provider (about 3 ms); EVP only
 * where a libcrypto lacks them.
 *
 * Libc (and libcrypto by dlopen) only. Thread-safe (libcrypto is opened once,
 * under pthread_once). Every function returns 0, or -1 with `err` set, and
 * writes nothing to `out` on failure unless said. */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DUET_SHA256_BYTES 32u
#define DUET_CRED_MAX_PAYLOAD 1024u

/* -1 with `err` set when libcrypto cannot be opened. (The slurm.key
 * credential's HMAC; duet_sha256 is what the HMAC builds on.) */
int duet_sha256(const void* data, size_t len, uint8_t out[DUET_SHA256_BYTES], char* err,
                size_t err_len);
int duet_hmac_sha256(const void* key, size_t key_len, const void* data, size_t len,
                     uint8_t out[DUET_SHA256_BYTES], char* err, size_t err_len);

/* Which interface of libcrypto the two functions above use: "sha256" (the
 * digest's own functions), "evp", or "none" (libcrypto not loadable). */
const char* duet_crypto_interface(void);
/* For tests: nonzero makes later calls use EVP where it exists. */
void duet_crypto_prefer_evp(int on);

/* The canonical text of the request (request_digest.h's CanonicalRequest):
 *   Hold node=<n>:<node> owner=slurm_step:<job>.<step> devices=1:<gpu>:0,... generation=0
 *   Release node=<n>:<node> owner=slurm_step:<job>.<step>
 *   Release node=<n>:<node> owner=slurm_job:<job>
 * `step` < 0: a slurm_job owner (Release only). */
int duet_cred_canonical(const char* method, const char* node, uint32_t job, int64_t step,
                        const uint32_t* gpus, size_t n_gpus, char* out, size_t cap);

/* slurm_munge::Payload of that call, at most DUET_CRED_MAX_PAYLOAD bytes:
 *   duet/v3 <canonical text> */
int duet_cred_payload(const char* method, const char* node, uint32_t job, int64_t step,
                      const uint32_t* gpus, size_t n_gpus, char* out, size_t cap);

/* slurm_key::LoadDerivedKey: reads the slurm.key at `path` (a regular file of
 * 16 bytes to 1 MiB that others cannot read or write) and derives duet's key
 * HMAC-SHA256(slurm.key, "duet spank step credential v1"). */
int duet_cred_slurm_key_derive(const char* path, uint8_t out[DUET_SHA256_BYTES], char* err,
                               size_t err_len);

/* slurm_key::Make with the given time and 16-byte nonce:
 *   duet-key2:<ts>:<nonce hex>:<payload, web-safe base64 without padding>:<mac hex> */
int duet_cred_slurm_key_make(const uint8_t derived[DUET_SHA256_BYTES], const char* payload,
                             int64_t unix_seconds, const uint8_t nonce[16], char* out,
                             size_t cap, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* DUET_COMMON_STEP_AGENT_STEP_CRED_H_ */
