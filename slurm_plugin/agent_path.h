#ifndef DUET_SLURM_PLUGIN_AGENT_PATH_H_
#define DUET_SLURM_PLUGIN_AGENT_PATH_H_

/* The agent path of spank_duet.so (plugstack agent=unix:///run/duet/agent.sock):
 * a GPU step's Hold and Release go to duet-node's step agent on this node
 * over a unix socket (common/step_agent/step_wire.h), which forwards them to
 * duet-bridge on its long-lived gRPC channel. Nothing of gRPC, protobuf,
 * Abseil, libstdc++ or libcrypto is loaded into slurmstepd: the credential is
 * made here in C (common/step_agent/step_cred.h; munge through libmunge,
 * which slurmstepd of an auth/munge cluster has loaded already).
 *
 * The same rules as the gRPC client (remote.cc): the credential is the same,
 * bound to the method and the request, and checked by the bridge (the agent
 * forwards it, it does not vouch); the decision is on the bridge's reason
 * only: NODE_NOT_SHARED runs the step unregistered, POD_EVICTING asks again
 * each second for the refusal's wait_s (at most an hour), DEVICE_UNKNOWN,
 * CREDENTIAL_REFUSED and every other refusal refuse the step; an agent that
 * cannot be reached, or that cannot reach the bridge (UNAVAILABLE,
 * DEADLINE_EXCEEDED), is plugstack on_unreachable's case.
 *
 * Serves steps whose devices are GPUs, without --duet-show; spank_duet.c
 * sends TPU steps and --duet-show to the gRPC client module (bridge=).
 * One slurmstepd serves one step: the state is this file's. */

#include <stddef.h>
#include <slurm/spank.h>

#include "slurm_plugin/plugin_args.h"

#ifdef __cplusplus
extern "C" {
#endif

/* init_post_opt (slurmstepd, root): send the step's Hold now, when Slurm has
 * set the step's GPU list (SLURM_STEP_GPUS or SLURM_JOB_GPUS; Slurm sets both
 * before spank_init), and read the answer in user_init. Slurm's own step
 * set-up (switch and MPI plugins, the task plugins' cgroups, PAM, the I/O
 * connection to srun) then runs while the bridge decides. Never for the
 * extern step, which has no user_init. Nothing is decided here: a Hold that
 * cannot be sent is asked again by user_init, and user_init refuses a step
 * whose GPU list changed in between. */
void duet_agent_start_hold(spank_t sp, const struct duet_spank_args* args);
/* user_init: hold the step's GPUs (or read the answer to the Hold
 * duet_agent_start_hold sent). 0 when the step may run (held, or
 * unregistered by NODE_NOT_SHARED or on_unreachable=allow), -1 with `err`
 * holding the refusal the user sees. */
int duet_agent_user_init(spank_t sp, const struct duet_spank_args* args, char* err,
                         size_t err_len);
/* exit: read the answer to an early Hold user_init never read (a step that
 * failed before user_init); release what the step held (and, for the batch step, the job's
 * import on this node). The agent answers a Release "queued" at once and
 * sends it to the bridge after (step_agent.h), so the step does not wait for
 * the bridge; an older agent answers with the bridge's answer. Failures are
 * logged: job import releases later. */
void duet_agent_exit(spank_t sp, const struct duet_spank_args* args);
/* Whether user_init held devices, or a Hold sent in init_post_opt is still
 * unanswered (exit has something to settle and release). */
int duet_agent_registered(void);

/* Forgets the step (for tests: a slurmstepd serves one step, so the plugin
 * keeps it in this file's statics). */
void duet_agent_forget(void);

/* The step's GPU indices from a Slurm list ("0,2-3"): sorted, unique, at
 * most `cap`; the count, or -1 for anything else ("NoDevFiles", UUIDs, more
 * than `cap`). */
int duet_agent_parse_gpus(const char* list, unsigned* out, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* DUET_SLURM_PLUGIN_AGENT_PATH_H_ */
