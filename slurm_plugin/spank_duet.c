/* spank_duet.so: the SPANK entry points.
 *
 * Slurm loads this plugin into every srun, sbatch and salloc, into slurmd, and
 * into each slurmstepd (steps, prolog and epilog). So it is plain C and links
 * libc only: no gRPC, protobuf, Abseil or libstdc++ to load and initialise in
 * processes that never talk to duet-bridge (measured: bench/slurm/RESULTS.md).
 * The bridge client lives in duet_spank_client.so, which this plugin dlopens
 * in slurmstepd only when the step may need the bridge: it has GPUs, TPUs may
 * be probed (then already in init_post_opt), or --duet-show was given. With
 * plugstack agent= a GPU step (no TPU probe, no --duet-show) loads nothing:
 * its Hold and Release go to duet-node's step agent (agent_path.h).
 *
 * Options, for srun/sbatch/salloc:
 *   --duet-show   print, when each step starts, the devices it got on each
 *                 node and who else (pods, other jobs) holds devices there.
 *                 Same as SLURM_DUET_SHOW=1 in the environment.
 * Plugstack arguments: see plugin_args.h. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <slurm/spank.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "slurm_plugin/agent_path.h"
#include "slurm_plugin/client_abi.h"
#include "slurm_plugin/plugin_args.h"

SPANK_PLUGIN(duet, 1);

static struct duet_spank_args g_args;
static int g_show;
/* Set in user_init when the step is refused. Slurm 22.05 reports a failed
 * user_init as "could not execve" with exit code 0 (srun rc 0, batch job
 * COMPLETED), so the refusal is delivered in task_init_privileged instead:
 * every task then fails before exec with exit code 1, which srun and sacct
 * report. */
static char g_refusal[4096];
/* What each task of a step with GPUs sees as CUDA_VISIBLE_DEVICES when
 * Slurm's per-task binding leaves it unset (--gpu-bind=none with several
 * tasks: every task would then see every GPU of the node, the pods' too):
 * Slurm's own step-level value (already renumbered where a device cgroup
 * applies), else the step's GPU indices. Set in user_init, applied in
 * task_init. */
static char g_visible_gpus[1024];
static duet_spank_client_exit_fn g_client_exit;
static duet_spank_client_init_post_opt_fn g_client_init_post_opt;

/* May run twice in slurmstepd (once per option pass): idempotent. */
static int on_show_option(int val, const char* optarg, int remote) {
  (void)val;
  (void)optarg;
  (void)remote;
  g_show = 1;
  return 0;
}

static struct spank_option g_show_option = {
    "duet-show", NULL,
    "duet: print, at step start, the GPUs/TPUs the step got on each node and which pods and "
    "jobs share the node (or SLURM_DUET_SHOW=1)",
    0, 0, on_show_option};

static int env_set(spank_t sp, const char* name) {
  char buf[64];
  spank_err_t e = spank_getenv(sp, name, buf, sizeof(buf));
  /* A value longer than buf is set too. */
  return (e == ESPANK_SUCCESS && buf[0] != '\0') || e == ESPANK_NOSPACE;
}

static int env_is(spank_t sp, const char* name, const char* want) {
  char buf[64];
  return spank_getenv(sp, name, buf, sizeof(buf)) == ESPANK_SUCCESS && strcmp(buf, want) == 0;
}

/* Whether the step's TPUs are probed (plugstack tpu=, or auto on a TPU host). */
static int tpu_probe_on(void) {
  switch (g_args.tpu) {
    case DUET_TPU_YES: return 1;
    case DUET_TPU_NO: return 0;
    default: return access("/dev/accel0", F_OK) == 0 || access("/dev/vfio/0", F_OK) == 0;
  }
}

/* Whether this step may need the bridge at all (cheap: env and two stats). */
static int step_needs_bridge(spank_t sp) {
  if (g_show) return 1;
  if (env_set(sp, "SLURM_STEP_GPUS") || env_set(sp, "SLURM_JOB_GPUS") ||
      env_set(sp, "CUDA_VISIBLE_DEVICES")) {
    return 1;
  }
  return tpu_probe_on();
}

/* The client module's path: client= or next to this .so. */
static int client_path(char* out, size_t len) {
  if (g_args.client[0]) {
    return snprintf(out, len, "%s", g_args.client) < (int)len ? 0 : -1;
  }
  Dl_info info;
  if (dladdr((void*)&slurm_spank_init, &info) == 0 || info.dli_fname == NULL) return -1;
  const char* slash = strrchr(info.dli_fname, '/');
  const int dir_len = slash ? (int)(slash - info.dli_fname) : 1;
  const char* dir = slash ? info.dli_fname : ".";
  return snprintf(out, len, "%.*s/%s", dir_len, dir, DUET_SPANK_CLIENT_MODULE) < (int)len ? 0
                                                                                        : -1;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static const char* auth_name(void) {
  return g_args.auth == DUET_AUTH_SLURM_KEY ? "slurm_key"
         : g_args.auth == DUET_AUTH_NONE    ? "none"
                                            : "munge";
}

/* Loads the client module once; NULL with `err` set on failure. */
static duet_spank_client_user_init_fn load_client(char* err, size_t err_len) {
  static duet_spank_client_user_init_fn user_init;
  if (user_init) return user_init;
  char path[DUET_ARG_MAX + 64];
  if (client_path(path, sizeof(path)) != 0) {
    snprintf(err, err_len, "cannot locate %s", DUET_SPANK_CLIENT_MODULE);
    return NULL;
  }
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    snprintf(err, err_len, "cannot load the bridge client: %s", dlerror());
    return NULL;
  }
  duet_spank_client_abi_fn abi = (duet_spank_client_abi_fn)dlsym(h, "duet_spank_client_abi");
  duet_spank_client_user_init_fn ui =
      (duet_spank_client_user_init_fn)dlsym(h, "duet_spank_client_user_init");
  duet_spank_client_exit_fn ex = (duet_spank_client_exit_fn)dlsym(h, "duet_spank_client_exit");
  duet_spank_client_init_post_opt_fn po =
      (duet_spank_client_init_post_opt_fn)dlsym(h, "duet_spank_client_init_post_opt");
  if (abi == NULL || ui == NULL || ex == NULL || po == NULL || abi() != DUET_SPANK_CLIENT_ABI) {
    snprintf(err, err_len, "%s is not a duet bridge client of ABI %u", path,
             DUET_SPANK_CLIENT_ABI);
    return NULL; /* never dlclose: a half-initialised module may have threads */
  }
  user_init = ui;
  g_client_exit = ex;
  g_client_init_post_opt = po;
  return user_init;
}

int slurm_spank_init(spank_t sp, int ac, char** av) {
  /* No network here: a failing required init in slurmd drains the node. */
  char err[2 * DUET_ARG_MAX];
  if (duet_spank_parse_args(ac, (const char* const*)av, &g_args, err, sizeof(err)) != 0) {
    slurm_error("duet: %s", err);
    return -1;
  }
  const spank_context_t ctx = spank_context();
  if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR || ctx == S_CTX_REMOTE) {
    if (spank_option_register(sp, &g_show_option) != ESPANK_SUCCESS) {
      slurm_error("duet: cannot register --duet-show");
      return -1;
    }
  }
  return 0;
}

/* slurmstepd, as root, before Slurm drops privileges: the TPU probe's
 * slurmctld RPC runs here. From Slurm 24.11, user_init runs with the auth
 * plugin's lock held, and any libslurm RPC there kills the step. A module that
 * cannot load is reported by user_init. On the agent path the step's Hold is
 * sent here and its answer read in user_init (agent_path.h): Slurm sets up the
 * step in between. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char** av) {
  (void)ac;
  (void)av;
  if (!spank_remote(sp) || g_args.disabled) return 0;
  if (tpu_probe_on()) {
    char err[sizeof(g_refusal) - 64];
    if (load_client(err, sizeof(err)) != NULL) g_client_init_post_opt(sp, &g_args);
    return 0;
  }
  if (env_is(sp, "SLURM_DUET_SHOW", "1")) g_show = 1;
  if (g_args.agent[0] && !g_show && step_needs_bridge(sp)) duet_agent_start_hold(sp, &g_args);
  return 0;
}

int slurm_spank_user_init(spank_t sp, int ac, char** av) {
  (void)ac;
  (void)av;
  if (!spank_remote(sp) || g_args.disabled) return 0;
  if (env_is(sp, "SLURM_DUET_SHOW", "1")) g_show = 1;
  if (!step_needs_bridge(sp)) return 0;
  char err[sizeof(g_refusal) - 64];
  const double t0 = now_ms();
  if (g_args.agent[0] && !g_show && !tpu_probe_on()) {
    if (duet_agent_user_init(sp, &g_args, err, sizeof(err)) != 0) {
      snprintf(g_refusal, sizeof(g_refusal), "%s", err);
    }
    slurm_debug("duet: user_init (auth %s): step agent %.1f ms (%s)", auth_name(),
                now_ms() - t0, g_args.agent);
  } else {
    duet_spank_client_user_init_fn user_init = load_client(err, sizeof(err));
    const double t1 = now_ms();
    if (user_init == NULL) {
      if (g_args.on_unreachable == DUET_UNREACHABLE_ALLOW) {
        slurm_info("duet: step runs unregistered: %s", err);
        return 0;
      }
      snprintf(g_refusal, sizeof(g_refusal), "step refused: %s; plugstack on_unreachable=fail",
               err);
    } else {
      if (user_init(sp, &g_args, g_show, err, sizeof(err)) != 0) {
        snprintf(g_refusal, sizeof(g_refusal), "%s", err);
      }
      /* SlurmdDebug=debug shows where a step's start-up time goes. */
      slurm_debug("duet: user_init (auth %s): client module %.1f ms, bridge %.1f ms",
                  auth_name(), t1 - t0, now_ms() - t1);
    }
  }
  if (g_refusal[0]) {
    slurm_error("duet: %s", g_refusal);
    return 0;
  }
  static const char* const kGpuLists[] = {"CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS",
                                          "SLURM_JOB_GPUS"};
  for (size_t i = 0; i < sizeof(kGpuLists) / sizeof(kGpuLists[0]); ++i) {
    if (spank_getenv(sp, kGpuLists[i], g_visible_gpus, sizeof(g_visible_gpus)) ==
            ESPANK_SUCCESS &&
        g_visible_gpus[0] != '\0') {
      break;
    }
    g_visible_gpus[0] = '\0';
  }
  return 0;
}

/* In each task, as the user, after Slurm set the task's GPU variables. */
int slurm_spank_task_init(spank_t sp, int ac, char** av) {
  (void)ac;
  (void)av;
  if (!spank_remote(sp) || g_visible_gpus[0] == '\0') return 0;
  char buf[8];
  if (spank_getenv(sp, "CUDA_VISIBLE_DEVICES", buf, sizeof(buf)) != ESPANK_ENV_NOEXIST) return 0;
  if (spank_setenv(sp, "CUDA_VISIBLE_DEVICES", g_visible_gpus, 1) != ESPANK_SUCCESS) {
    slurm_error("duet: cannot set CUDA_VISIBLE_DEVICES=%s for the task", g_visible_gpus);
    return -1;
  }
  return 0;
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char** av) {
  (void)ac;
  (void)av;
  if (!spank_remote(sp) || g_refusal[0] == '\0') return 0;
  return -1;
}

int slurm_spank_exit(spank_t sp, int ac, char** av) {
  (void)ac;
  (void)av;
  if (!spank_remote(sp)) return 0;
  if (duet_agent_registered()) {
    const double t0 = now_ms();
    duet_agent_exit(sp, &g_args);
    slurm_debug("duet: exit (auth %s): step agent %.1f ms (%s)", auth_name(), now_ms() - t0,
                g_args.agent);
    return 0;
  }
  if (g_client_exit == NULL) return 0;
  const double t0 = now_ms();
  g_client_exit(sp, &g_args);
  slurm_debug("duet: exit (auth %s): bridge %.1f ms", auth_name(), now_ms() - t0);
  return 0;
}
