#define _GNU_SOURCE
#include "slurm_plugin/agent_path.h"

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <munge.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/step_agent/step_cred.h"
#include "common/step_agent/step_wire.h"

/* Slurm's batch step id (SLURM_BATCH_SCRIPT in slurm.h, which this C file
 * does not include: spank.h is all it needs of Slurm). */
#define DUET_BATCH_STEP 0xfffffffbu
/* The extern step (SLURM_EXTERN_CONT, PrologFlags=Contain): Slurm calls its
 * init but never its user_init, and it lives as long as the job. */
#define DUET_EXTERN_STEP 0xfffffffcu
/* Never longer than this, whatever the bridge says (slurm.preemption_wait is
 * at most 1 h), as remote.cc. */
#define DUET_MAX_EVICTION_WAIT_S 3600

/* snprintf for messages, which may be cut at the buffer's end. */
__attribute__((format(printf, 3, 4))) static void say(char* buf, size_t len, const char* fmt,
                                                      ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, len, fmt, ap);
  va_end(ap);
}

static struct {
  int registered;
  char node[DUET_WIRE_MAX_NODE + 1];
  uint32_t job_id;
  uint32_t step_id;
} g_step;

/* The Hold sent in init_post_opt (duet_agent_start_hold), its answer read in
 * user_init: while the bridge decides, slurmstepd sets up the step (switch
 * and MPI plugins, task plugins' cgroups, PAM, the I/O connection to srun),
 * so that much of the round trip is off the step's path. fd -1: none. */
static struct {
  int fd;
  int tried;
  struct duet_wire_request r; /* what was asked (the credential wiped) */
  char note[600];             /* why no credential went, if none did */
  double sent_at;
} g_early = {.fd = -1};

int duet_agent_registered(void) { return g_step.registered || g_early.fd >= 0; }

void duet_agent_forget(void) {
  if (g_early.fd >= 0) close(g_early.fd);
  memset(&g_early, 0, sizeof(g_early));
  g_early.fd = -1;
  memset(&g_step, 0, sizeof(g_step));
}

int duet_agent_parse_gpus(const char* list, unsigned* out, size_t cap) {
  size_t n = 0;
  const char* p = list;
  if (*p == '\0') return 0;
  for (;;) {
    char* end = NULL;
    if (*p < '0' || *p > '9') return -1;
    errno = 0;
    unsigned long lo = strtoul(p, &end, 10), hi = lo;
    if (errno || lo > UINT32_MAX) return -1;
    p = end;
    if (*p == '-') {
      ++p;
      if (*p < '0' || *p > '9') return -1;
      hi = strtoul(p, &end, 10);
      if (errno || hi > UINT32_MAX || hi < lo) return -1;
      p = end;
    }
    for (unsigned long i = lo; i <= hi; ++i) {
      /* Insert sorted, skipping duplicates. */
      size_t at = 0;
      while (at < n && out[at] < i) ++at;
      if (at < n && out[at] == i) continue;
      if (n == cap) return -1;
      memmove(out + at + 1, out + at, (n - at) * sizeof(*out));
      out[at] = (unsigned)i;
      ++n;
    }
    if (*p == '\0') return (int)n;
    if (*p != ',') return -1;
    ++p;
  }
}

/* slurmstepd runs user_init with its effective uid dropped to the job's user
 * (the saved uid stays root); the agent's socket is root's, and munged
 * records the caller's effective uid (the bridge accepts root's). Returns the
 * uid to restore, or (uid_t)-1 when nothing was raised. */
static uid_t raise_root(void) {
  const uid_t prev = geteuid();
  if (prev != 0 && seteuid(0) == 0) return prev;
  return (uid_t)-1;
}

static void restore_uid(uid_t prev) {
  if (prev != (uid_t)-1 && seteuid(prev) != 0) abort(); /* never run the tasks as root */
}

/* libmunge, loaded once (slurmstepd of an auth/munge cluster has it). */
typedef munge_ctx_t (*munge_ctx_create_fn)(void);
typedef void (*munge_ctx_destroy_fn)(munge_ctx_t);
typedef munge_err_t (*munge_ctx_set_fn)(munge_ctx_t, int, ...);
typedef const char* (*munge_ctx_strerror_fn)(munge_ctx_t);
typedef munge_err_t (*munge_encode_fn)(char**, munge_ctx_t, const void*, int);
typedef const char* (*munge_strerror_fn)(munge_err_t);

static int munge_credential(const char* socket, const char* payload, char* out, size_t cap,
                            char* err, size_t err_len) {
  static void* lib;
  if (lib == NULL) lib = dlopen("libmunge.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    say(err, err_len, "munge: cannot load libmunge.so.2: %s", dlerror());
    return -1;
  }
  munge_ctx_create_fn create = (munge_ctx_create_fn)dlsym(lib, "munge_ctx_create");
  munge_ctx_destroy_fn destroy = (munge_ctx_destroy_fn)dlsym(lib, "munge_ctx_destroy");
  munge_ctx_set_fn set = (munge_ctx_set_fn)dlsym(lib, "munge_ctx_set");
  munge_ctx_strerror_fn ctx_error = (munge_ctx_strerror_fn)dlsym(lib, "munge_ctx_strerror");
  munge_encode_fn encode = (munge_encode_fn)dlsym(lib, "munge_encode");
  munge_strerror_fn strerr = (munge_strerror_fn)dlsym(lib, "munge_strerror");
  if (!create || !destroy || !set || !ctx_error || !encode || !strerr) {
    say(err, err_len, "munge: libmunge.so.2 lacks munge_encode or its context calls");
    return -1;
  }
  munge_ctx_t ctx = create();
  if (ctx == NULL) {
    say(err, err_len, "munge: munge_ctx_create failed");
    return -1;
  }
  if (socket[0] && set(ctx, MUNGE_OPT_SOCKET, socket) != EMUNGE_SUCCESS) {
    say(err, err_len, "munge socket %s: %s", socket,
             ctx_error(ctx) ? ctx_error(ctx) : "unknown");
    destroy(ctx);
    return -1;
  }
  char* cred = NULL;
  const munge_err_t e = encode(&cred, ctx, payload, (int)strlen(payload));
  if (e != EMUNGE_SUCCESS) {
    say(err, err_len, "munge_encode: %s", ctx_error(ctx) ? ctx_error(ctx) : strerr(e));
    destroy(ctx);
    free(cred);
    return -1;
  }
  destroy(ctx);
  const int fits = snprintf(out, cap, "%s", cred) < (int)cap;
  free(cred);
  if (!fits) snprintf(err, err_len, "munge credential longer than %zu bytes", cap);
  return fits ? 0 : -1;
}

static int slurm_key_credential(const char* configured, const char* payload, char* out,
                                size_t cap, char* err, size_t err_len) {
  const char* path = configured;
  if (path[0] == '\0') path = getenv("SLURM_SACK_KEY");
  if (path == NULL || path[0] == '\0') path = "/etc/slurm/slurm.key";
  uint8_t derived[DUET_SHA256_BYTES];
  if (duet_cred_slurm_key_derive(path, derived, err, err_len) != 0) return -1;
  uint8_t nonce[16];
  if (getrandom(nonce, sizeof(nonce), 0) != (ssize_t)sizeof(nonce)) {
    say(err, err_len, "no random bytes for a credential nonce: %s", strerror(errno));
    memset(derived, 0, sizeof(derived));
    return -1;
  }
  const int rc = duet_cred_slurm_key_make(derived, payload, (int64_t)time(NULL), nonce, out,
                                          cap, err, err_len);
  memset(derived, 0, sizeof(derived));
  return rc;
}

/* The request's credential per plugstack auth=; on failure the call goes
 * without one and `note` says why (the bridge's refusal then names it). */
static void attach_credential(const struct duet_spank_args* a, const char* method,
                              struct duet_wire_request* r, char* note, size_t note_len) {
  note[0] = '\0';
  r->cred_kind = DUET_WIRE_CRED_NONE;
  r->cred[0] = '\0';
  if (a->auth == DUET_AUTH_NONE) return;
  char payload[DUET_CRED_MAX_PAYLOAD + 1];
  const int64_t step = r->type == DUET_WIRE_RELEASE_JOB ? -1 : (int64_t)r->step_id;
  if (duet_cred_payload(method, r->node, r->job_id, step, r->gpus, r->n_gpus, payload,
                        sizeof(payload)) != 0) {
    say(note, note_len, "credential payload too long");
    return;
  }
  char why[512];
  int rc;
  if (a->auth == DUET_AUTH_MUNGE) {
    rc = munge_credential(a->munge_socket, payload, r->cred, sizeof(r->cred), why, sizeof(why));
  } else {
    rc = slurm_key_credential(a->slurm_key, payload, r->cred, sizeof(r->cred), why, sizeof(why));
  }
  if (rc != 0) {
    r->cred[0] = '\0';
    say(note, note_len, "%s", why);
    return;
  }
  r->cred_kind = a->auth == DUET_AUTH_MUNGE ? DUET_WIRE_CRED_MUNGE : DUET_WIRE_CRED_SLURM_KEY;
}

enum { CALL_ANSWERED = 0, CALL_UNREACHABLE = 1, CALL_BAD = 2 };

/* Connects to the agent and sends the request; CALL_ANSWERED with *fd_out
 * open (the reply is agent_receive's), else CALL_UNREACHABLE or CALL_BAD with
 * `err`. */
static int agent_send(const struct duet_spank_args* a, const struct duet_wire_request* r,
                      int* fd_out, char* err, size_t err_len) {
  static uint8_t frame[DUET_WIRE_MAX_FRAME];
  char why[256];
  *fd_out = -1;
  const long n = duet_wire_encode_request(r, frame, sizeof(frame), why, sizeof(why));
  if (n < 0) {
    say(err, err_len, "%s", why);
    return CALL_BAD;
  }
  const char* path = a->agent + strlen("unix://");
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  say(addr.sun_path, sizeof(addr.sun_path), "%s", path);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    say(err, err_len, "socket: %s", strerror(errno));
    return CALL_UNREACHABLE;
  }
  /* The agent gives the bridge timeout_ms; its answer gets a second more. */
  const int wait_ms = a->timeout_ms + 1000;
  struct timeval tv = {wait_ms / 1000, (wait_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd, (struct sockaddr*)&addr, sizeof(addr)) != 0) {
    say(err, err_len, "connect %s: %s", path, strerror(errno));
    close(fd);
    return CALL_UNREACHABLE;
  }
  for (long off = 0; off < n;) {
    const ssize_t w = send(fd, frame + off, (size_t)(n - off), MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      say(err, err_len, "send to %s: %s", path, strerror(errno));
      close(fd);
      return CALL_UNREACHABLE;
    }
    off += w;
  }
  *fd_out = fd;
  return CALL_ANSWERED;
}

/* Reads the reply to what agent_send sent on `fd`, and closes it. */
static int agent_receive(const struct duet_spank_args* a, int fd, struct duet_wire_reply* reply,
                         char* err, size_t err_len) {
  static uint8_t frame[DUET_WIRE_MAX_FRAME];
  const char* path = a->agent + strlen("unix://");
  int rc = CALL_UNREACHABLE;
  size_t got = 0, want = DUET_WIRE_HEADER;
  while (got < want) {
    const ssize_t m = read(fd, frame + got, want - got);
    if (m < 0 && errno == EINTR) continue;
    if (m <= 0) {
      say(err, err_len, "no answer from %s: %s", path,
               m == 0 ? "connection closed" : strerror(errno));
      goto out;
    }
    got += (size_t)m;
    if (got == DUET_WIRE_HEADER && want == DUET_WIRE_HEADER) {
      uint8_t type = 0;
      uint32_t body = 0;
      if (duet_wire_parse_header(frame, got, &type, &body, err, err_len) != 0) {
        rc = CALL_BAD;
        goto out;
      }
      want += body;
    }
  }
  if (duet_wire_decode_reply(frame, got, reply, err, err_len) != 0) {
    rc = CALL_BAD;
    goto out;
  }
  rc = CALL_ANSWERED;
out:
  close(fd);
  return rc;
}

/* One request, one reply. CALL_UNREACHABLE with `err` when the agent cannot
 * be reached or does not answer in time; CALL_BAD when it answered garbage. */
static int call_agent(const struct duet_spank_args* a, const struct duet_wire_request* r,
                      struct duet_wire_reply* reply, char* err, size_t err_len) {
  int fd;
  const int rc = agent_send(a, r, &fd, err, err_len);
  return rc == CALL_ANSWERED ? agent_receive(a, fd, reply, err, err_len) : rc;
}

/* google.rpc.Code values the decision needs. */
enum { CODE_DEADLINE_EXCEEDED = 4, CODE_UNAVAILABLE = 14 };

static double mono_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static const char* auth_label(const struct duet_spank_args* a) {
  return a->auth == DUET_AUTH_SLURM_KEY ? "slurm_key" : a->auth == DUET_AUTH_NONE ? "none" : "munge";
}

/* A refusal's message says why no credential went with the call. */
static void add_note(int rc, struct duet_wire_reply* reply, const char* note) {
  if (rc == CALL_ANSWERED && reply->code != 0 && note[0]) {
    const size_t len = strlen(reply->message);
    say(reply->message + len, sizeof(reply->message) - len, " (no credential sent: %s)",
             note);
  }
}

/* Makes the credential and calls; the credential is fresh for each call (the
 * bridge refuses one presented twice). */
static int call_with_credential(const struct duet_spank_args* a, const char* method,
                                struct duet_wire_request* r, struct duet_wire_reply* reply,
                                char* err, size_t err_len) {
  char note[600];
  const uid_t prev = raise_root();
  const double t0 = mono_s();
  attach_credential(a, method, r, note, sizeof(note));
  const double t1 = mono_s();
  const int rc = call_agent(a, r, reply, err, err_len);
  restore_uid(prev);
  /* SlurmdDebug=debug shows where the call's time goes. */
  slurm_debug("duet: agent %s (auth %s): credential %.2f ms, agent and bridge %.2f ms (%s)", method,
              auth_label(a), (t1 - t0) * 1e3, (mono_s() - t1) * 1e3, a->agent);
  memset(r->cred, 0, sizeof(r->cred));
  add_note(rc, reply, note);
  return rc;
}


static const char* credential_hint(const char* why) {
  if (strcmp(why, "expired") == 0) {
    return ": made longer ago than slurm.credential_max_age, or this node's clock is off";
  }
  if (strcmp(why, "replayed") == 0) return ": it was presented before";
  if (strcmp(why, "wrong_method") == 0 || strcmp(why, "wrong_request") == 0) {
    return ": it was made for another call";
  }
  if (strcmp(why, "wrong_version") == 0) {
    return ": spank_duet and duet-bridge are different releases";
  }
  if (strcmp(why, "bad_signature") == 0 || strcmp(why, "wrong_uid") == 0) {
    return ": the bridge does not trust who made it (munge key, slurm.key or uid)";
  }
  if (strcmp(why, "missing") == 0) {
    return ": none was sent (plugstack auth= must match slurm.credential)";
  }
  return "";
}

/* The device variables of a step that may run (DeviceEnv in remote.cc):
 * Slurm's own CUDA_VISIBLE_DEVICES stays (it may be renumbered under a
 * device cgroup); else the step's GPU indices. */
#define DUET_GPU_LIST_MAX (DUET_WIRE_MAX_DEVICES * 11 + 1)

/* "0,3": a request's GPU indices as Slurm lists them. */
static const char* gpu_list(const struct duet_wire_request* r, char list[DUET_GPU_LIST_MAX]) {
  size_t len = 0;
  list[0] = '\0';
  for (uint32_t i = 0; i < r->n_gpus; ++i) {
    len += (size_t)snprintf(list + len, DUET_GPU_LIST_MAX - len, "%s%" PRIu32, i ? "," : "",
                            r->gpus[i]);
  }
  return list;
}

static void export_gpus(spank_t sp, const struct duet_wire_request* r) {
  char have[8];
  if (spank_getenv(sp, "CUDA_VISIBLE_DEVICES", have, sizeof(have)) != ESPANK_ENV_NOEXIST) return;
  char list[DUET_GPU_LIST_MAX];
  spank_setenv(sp, "CUDA_VISIBLE_DEVICES", gpu_list(r, list), 1);
}


/* The step's Hold: its job and step ids, GPUs and node. 1 when there is
 * something to hold, 0 when the step has no GPUs, -1 with `err`. The GPUs are
 * the first set of SLURM_STEP_GPUS, SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES
 * (step_devices.h); with slurm_only (the early Hold) Slurm's own two only, and
 * 0 when neither is set. */
static int step_request(spank_t sp, const struct duet_spank_args* a, int slurm_only,
                        struct duet_wire_request* r, char* err, size_t err_len) {
  memset(r, 0, sizeof(*r));
  r->type = DUET_WIRE_HOLD_STEP;
  r->timeout_ms = (uint32_t)a->timeout_ms;
  if (spank_get_item(sp, S_JOB_ID, &r->job_id) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_STEPID, &r->step_id) != ESPANK_SUCCESS) {
    say(err, err_len, "cannot read the job and step ids");
    return -1;
  }
  static const char* const kLists[] = {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS",
                                       "CUDA_VISIBLE_DEVICES"};
  const size_t lists = slurm_only ? 2 : sizeof(kLists) / sizeof(kLists[0]);
  char list[4096] = "";
  for (size_t i = 0; i < lists; ++i) {
    if (spank_getenv(sp, kLists[i], list, sizeof(list)) == ESPANK_SUCCESS && list[0]) break;
    list[0] = '\0';
  }
  unsigned gpus[DUET_WIRE_MAX_DEVICES];
  const int n = duet_agent_parse_gpus(list, gpus, DUET_WIRE_MAX_DEVICES);
  if (n < 0) {
    say(err, err_len, "cannot read the step's GPUs from \"%s\"", list);
    return -1;
  }
  if (n == 0) return 0; /* nothing to fence */
  r->n_gpus = (uint32_t)n;
  for (int i = 0; i < n; ++i) r->gpus[i] = gpus[i];
  /* slurmstepd's own environment, never the step's: see remote.cc NodeName. */
  const char* node = getenv("SLURMD_NODENAME");
  if (node == NULL || node[0] == '\0' || strlen(node) > DUET_WIRE_MAX_NODE) {
    say(err, err_len,
             "slurmstepd's environment has no SLURMD_NODENAME: cannot tell which node this "
             "step runs on");
    return -1;
  }
  say(r->node, sizeof(r->node), "%s", node);
  return 1;
}

static int same_hold(const struct duet_wire_request* x, const struct duet_wire_request* y) {
  return x->job_id == y->job_id && x->step_id == y->step_id && x->n_gpus == y->n_gpus &&
         memcmp(x->gpus, y->gpus, x->n_gpus * sizeof(x->gpus[0])) == 0 &&
         strcmp(x->node, y->node) == 0;
}

static void register_step(const struct duet_wire_request* r) {
  g_step.registered = 1;
  say(g_step.node, sizeof(g_step.node), "%s", r->node);
  g_step.job_id = r->job_id;
  g_step.step_id = r->step_id;
}

void duet_agent_start_hold(spank_t sp, const struct duet_spank_args* a) {
  if (g_early.tried) return; /* once per step */
  g_early.tried = 1;
  char why[256];
  /* user_init, where there is one, asks itself and says what is wrong. */
  if (step_request(sp, a, 1, &g_early.r, why, sizeof(why)) != 1 ||
      g_early.r.step_id == DUET_EXTERN_STEP) {
    return;
  }
  const uid_t prev = raise_root();
  const double t0 = mono_s();
  attach_credential(a, "Hold", &g_early.r, g_early.note, sizeof(g_early.note));
  const double t1 = mono_s();
  const int sent = agent_send(a, &g_early.r, &g_early.fd, why, sizeof(why)) == CALL_ANSWERED;
  restore_uid(prev);
  memset(g_early.r.cred, 0, sizeof(g_early.r.cred));
  g_early.sent_at = mono_s();
  slurm_debug("duet: agent Hold (auth %s) sent in init_post_opt: credential %.2f ms, send %.2f "
              "ms%s%s (%s)",
              auth_label(a), (t1 - t0) * 1e3, (g_early.sent_at - t1) * 1e3,
              sent ? "" : "; not sent, user_init asks again: ", sent ? "" : why, a->agent);
}

/* The early Hold's answer, in user_init. */
static int early_answer(const struct duet_spank_args* a, struct duet_wire_reply* reply, char* err,
                        size_t err_len) {
  const double t0 = mono_s();
  const int fd = g_early.fd;
  g_early.fd = -1;
  const int rc = agent_receive(a, fd, reply, err, err_len);
  const double t1 = mono_s();
  slurm_debug("duet: agent Hold (auth %s) answered %.2f ms after init_post_opt sent it, "
              "waited %.2f ms of it in user_init (%s)",
              auth_label(a), (t1 - g_early.sent_at) * 1e3, (t1 - t0) * 1e3, a->agent);
  add_note(rc, reply, g_early.note);
  return rc;
}

/* The early Hold's answer where user_init did not read it (it never ran, or
 * asked for something else): a Hold the bridge granted is the step's, and
 * exit releases it. */
static void settle_early(const struct duet_spank_args* a) {
  if (g_early.fd < 0) return;
  static struct duet_wire_reply reply;
  char why[256];
  const int fd = g_early.fd;
  g_early.fd = -1;
  if (agent_receive(a, fd, &reply, why, sizeof(why)) == CALL_ANSWERED && reply.code == 0) {
    register_step(&g_early.r);
  }
}

int duet_agent_user_init(spank_t sp, const struct duet_spank_args* a, char* err,
                         size_t err_len) {
  static struct duet_wire_request r;
  static struct duet_wire_reply reply;
  const int k = step_request(sp, a, 0, &r, err, err_len);
  if (k <= 0) {
    settle_early(a);
    return k;
  }
  char step[48];
  say(step, sizeof(step), "%" PRIu32 ".%" PRIu32, r.job_id, r.step_id);
  int early = g_early.fd >= 0;
  if (early && !same_hold(&g_early.r, &r)) {
    /* Nothing of Slurm changes these between the two calls; another SPANK
     * plugin may have. The step would run on devices it does not hold. */
    settle_early(a);
    char held[DUET_GPU_LIST_MAX], now[DUET_GPU_LIST_MAX];
    say(err, err_len,
        "step %s refused on node %s: its GPUs changed between slurm_spank_init_post_opt, which "
        "asked for GPUs %s, and user_init, which sees %s (SLURM_STEP_GPUS, SLURM_JOB_GPUS or "
        "CUDA_VISIBLE_DEVICES rewritten in between, by another SPANK plugin?)",
        step, r.node, gpu_list(&g_early.r, held), gpu_list(&r, now));
    return -1;
  }

  char why[1024];
  const double start = mono_s();
  int said = 0;
  int rc;
  for (;;) {
    if (early) {
      rc = early_answer(a, &reply, why, sizeof(why));
      early = 0;
    } else {
      rc = call_with_credential(a, "Hold", &r, &reply, why, sizeof(why));
    }
    if (rc != CALL_ANSWERED || strcmp(reply.reason, "POD_EVICTING") != 0) break;
    /* Slurm preempted a pod's placeholder for this job and the bridge is
     * evicting the pod: ask again each second for as long as wait_s says. */
    const char* w = duet_wire_reply_meta(&reply, "wait_s");
    const double now = mono_s();
    double deadline = now + (w ? atof(w) : 0);
    if (deadline > start + DUET_MAX_EVICTION_WAIT_S) deadline = start + DUET_MAX_EVICTION_WAIT_S;
    if (now >= deadline) break;
    if (!said) {
      const char* holder = duet_wire_reply_meta(&reply, "holder");
      slurm_info("duet: step %s on %s waits up to %s s for pod %s to leave its devices "
                 "(Slurm preempted the pod's placeholder for this job)",
                 step, r.node, w ? w : "0", holder ? holder : "?");
      said = 1;
    }
    double pause = deadline - now < 1.0 ? deadline - now : 1.0;
    struct timespec ts = {(time_t)pause, (long)((pause - (double)(time_t)pause) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
  if (said && rc == CALL_ANSWERED && reply.code == 0) {
    slurm_info("duet: step %s on %s got its devices after %.1f s", step, r.node,
               mono_s() - start);
  }

  const int unreachable =
      rc == CALL_UNREACHABLE ||
      (rc == CALL_ANSWERED && (reply.code == CODE_UNAVAILABLE || reply.code == CODE_DEADLINE_EXCEEDED));
  if (rc == CALL_UNREACHABLE) {
    say(reply.message, sizeof(reply.message), "duet-node's step agent %s: %s", a->agent, why);
  }
  if (rc == CALL_ANSWERED && reply.code == 0) {
    register_step(&r);
    export_gpus(sp, &r);
    return 0;
  }
  if (unreachable && a->on_unreachable == DUET_UNREACHABLE_ALLOW) {
    slurm_info("duet: step %s on %s runs unregistered: %s unreachable (%s)", step, r.node,
               a->agent, reply.message);
    export_gpus(sp, &r);
    return 0;
  }
  if (rc == CALL_BAD) {
    say(err, err_len, "step %s refused on node %s: %s", step, r.node, why);
    return -1;
  }
  if (unreachable) {
    say(err, err_len, "step %s on %s refused: duet-bridge unreachable through %s (%s); "
             "plugstack on_unreachable=fail", step, r.node, a->agent, reply.message);
    return -1;
  }
  if (strcmp(reply.reason, "NODE_NOT_SHARED") == 0) { /* nothing to fence */
    export_gpus(sp, &r);
    return 0;
  }
  if (said && strcmp(reply.reason, "POD_EVICTING") == 0) {
    say(err, err_len,
             "step %s refused on node %s: waited %.0f s for the pod on its devices to be "
             "evicted (Slurm preempted its placeholder for this job), and the pod is still "
             "there (a PodDisruptionBudget may forbid the eviction; see "
             "duet_pod_evictions_total): %s", step, r.node, mono_s() - start, reply.message);
    return -1;
  }
  if (strcmp(reply.reason, "DEVICE_UNKNOWN") == 0) {
    const char* dev = duet_wire_reply_meta(&reply, "device");
    say(err, err_len,
             "step %s refused on node %s: Slurm gave it %s, which duet's inventory of this "
             "shared node does not list, so it cannot be fenced from Kubernetes pods (check "
             "the node's gres.conf against duet's inventory): %s",
             step, r.node, dev ? dev : "a device", reply.message);
    return -1;
  }
  if (strcmp(reply.reason, "CREDENTIAL_REFUSED") == 0) {
    const char* w = duet_wire_reply_meta(&reply, "why");
    w = w ? w : "unknown";
    say(err, err_len,
             "step %s refused on node %s: duet-bridge refused this step's credential (why=%s%s): %s",
             step, r.node, w, credential_hint(w), reply.message);
    return -1;
  }
  say(err, err_len, "step %s refused on node %s: %s", step, r.node, reply.message);
  return -1;
}

static void release(const struct duet_spank_args* a, uint8_t type) {
  static struct duet_wire_request r;
  static struct duet_wire_reply reply;
  memset(&r, 0, sizeof(r));
  r.type = type;
  r.timeout_ms = (uint32_t)a->timeout_ms;
  say(r.node, sizeof(r.node), "%s", g_step.node);
  r.job_id = g_step.job_id;
  r.step_id = type == DUET_WIRE_RELEASE_JOB ? 0 : g_step.step_id;
  char why[1024];
  const int rc = call_with_credential(a, "Release", &r, &reply, why, sizeof(why));
  if (rc == CALL_ANSWERED && reply.code == 0) {
    if (duet_wire_reply_meta(&reply, "queued") != NULL) {
      slurm_debug("duet: release queued by %s (sent to the bridge after the step)", a->agent);
    }
    return;
  }
  /* Job import releases it once the job has ended. */
  char what[64];
  if (type == DUET_WIRE_RELEASE_JOB) {
    say(what, sizeof(what), "job %" PRIu32, r.job_id);
  } else {
    say(what, sizeof(what), "step %" PRIu32 ".%" PRIu32, r.job_id, r.step_id);
  }
  slurm_info("duet: release of %s on %s failed: %s", what, r.node,
             rc == CALL_ANSWERED ? reply.message : why);
}

void duet_agent_exit(spank_t sp, const struct duet_spank_args* a) {
  (void)sp;
  settle_early(a);
  if (!g_step.registered) return;
  g_step.registered = 0;
  release(a, DUET_WIRE_RELEASE_STEP);
  /* The batch script has ended, so the job has: what job import recorded for
   * it on this node goes now (remote.cc RemoteExit). */
  if (g_step.step_id == DUET_BATCH_STEP) release(a, DUET_WIRE_RELEASE_JOB);
}
