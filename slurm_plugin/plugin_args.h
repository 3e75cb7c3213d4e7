#ifndef DUET_SLURM_PLUGIN_PLUGIN_ARGS_H_
#define DUET_SLURM_PLUGIN_PLUGIN_ARGS_H_

/* spank_duet's plugstack arguments, parsed in plain C: spank_duet.so is loaded
 * by every srun/sbatch/salloc and slurmstepd, so it links nothing but libc
 * (see spank_duet.c). duet_spank_client.so receives the parsed struct.
 *
 *   required /usr/lib/duet/spank_duet.so bridge=unix:///run/duet/bridge.sock timeout_ms=2000
 *
 * Keys:
 *   bridge=ADDR          gRPC target of duet-bridge: unix:///path or host:port
 *                        (default unix:///run/duet/bridge.sock)
 *   agent=unix:///PATH   duet-node's step agent on this node (for example
 *                        unix:///run/duet/agent.sock): GPU steps without
 *                        --duet-show hold and release through it, with no
 *                        gRPC in slurmstepd (agent_path.h); TPU steps and
 *                        --duet-show still use bridge=. Default: none (every
 *                        step uses bridge=).
 *   timeout_ms=N         deadline of each call to the bridge (default 2000, 1..60000)
 *   on_unreachable=fail|allow
 *                        what a step does when the bridge cannot be reached.
 *                        Default fail: a step the ledger does not know about
 *                        could be given to a pod by the bridge in the meantime
 *                        (invariant I1 beats availability). allow runs the step
 *                        unregistered and logs it; job import records it later.
 *   tpu=auto|yes|no      read TPU indices from the job's GRES detail (one
 *                        slurmctld RPC per step): auto does so only on nodes
 *                        with /dev/accel0 or /dev/vfio/0 (default auto).
 *   client=PATH          the bridge client module (default: duet_spank_client.so
 *                        in the directory of spank_duet.so)
 *   auth=munge|slurm_key|none
 *                        the credential sent with each Hold/Release so the
 *                        bridge can check that slurmstepd of that job and step
 *                        on this node is calling (DESIGN.md §9): munge (default;
 *                        clusters that run auth/munge), slurm_key (clusters
 *                        that run auth/slurm: an HMAC under the cluster's
 *                        slurm.key, which slurmstepd reads as root), none.
 *                        The bridge's slurm.credential must match.
 *   munge=yes|no         older spelling: yes = auth=munge, no = auth=none
 *   munge_socket=PATH    munged socket (default: libmunge's,
 *                        /run/munge/munge.socket.2)
 *   slurm_key=PATH       the cluster's slurm.key for auth=slurm_key (default:
 *                        $SLURM_SACK_KEY, else /etc/slurm/slurm.key)
 *   disabled             load the plugin but do nothing (for staged rollouts).
 * Unknown keys and bad values are errors (the plugin then fails to load). */

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { DUET_ARG_MAX = 1024 };

enum duet_on_unreachable { DUET_UNREACHABLE_FAIL = 0, DUET_UNREACHABLE_ALLOW = 1 };
enum duet_tpu_probe { DUET_TPU_AUTO = 0, DUET_TPU_YES = 1, DUET_TPU_NO = 2 };
enum duet_auth { DUET_AUTH_MUNGE = 0, DUET_AUTH_SLURM_KEY = 1, DUET_AUTH_NONE = 2 };

struct duet_spank_args {
  char bridge[DUET_ARG_MAX];
  char agent[DUET_ARG_MAX]; /* "" = no agent; else unix:///absolute/path */
  int timeout_ms;
  int on_unreachable; /* enum duet_on_unreachable */
  int tpu;            /* enum duet_tpu_probe */
  char client[DUET_ARG_MAX];       /* "" = next to spank_duet.so */
  int auth;                        /* enum duet_auth */
  char munge_socket[DUET_ARG_MAX]; /* "" = libmunge's default */
  char slurm_key[DUET_ARG_MAX];    /* "" = $SLURM_SACK_KEY or /etc/slurm/slurm.key */
  int disabled;
};

/* Defaults, then each argument. Returns 0, or -1 with `err` naming the bad
 * argument: plugstack argument "bogus=1": unknown key (...). */
int duet_spank_parse_args(int argc, const char* const* argv, struct duet_spank_args* out,
                          char* err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* DUET_SLURM_PLUGIN_PLUGIN_ARGS_H_ */
