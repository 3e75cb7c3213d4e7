#ifndef DUET_SLURM_PLUGIN_CLIENT_ABI_H_
#define DUET_SLURM_PLUGIN_CLIENT_ABI_H_

/* The C interface between spank_duet.so (thin, libc only, loaded by every
 * Slurm command and daemon) and duet_spank_client.so (the gRPC bridge client,
 * which spank_duet.so dlopens in slurmstepd only, and only for a step that
 * needs the bridge). Both are built from this tree; the ABI number guards
 * against mixing a plugin and a client module of different builds. */

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include <slurm/spank.h>

#include "slurm_plugin/plugin_args.h"

#define DUET_SPANK_CLIENT_ABI 4u  /* 3: duet_spank_args.auth, .slurm_key; 4: .agent */

typedef unsigned (*duet_spank_client_abi_fn)(void);
/* init_post_opt in slurmstepd (root, before the privilege drop), only when
 * TPUs are probed: load from slurmctld what user_init needs but must not ask
 * for (from Slurm 24.11 a libslurm RPC in user_init kills the step). A
 * failure is kept and refuses the step in user_init. */
typedef void (*duet_spank_client_init_post_opt_fn)(spank_t sp,
                                                   const struct duet_spank_args* args);
/* user_init in slurmstepd: register the step's devices with the bridge,
 * export the device variables, print what --duet-show asks for. Returns 0,
 * or -1 with `err` holding the refusal the user sees. */
typedef int (*duet_spank_client_user_init_fn)(spank_t sp, const struct duet_spank_args* args,
                                              int show, char* err, size_t err_len);
/* exit in slurmstepd: release what user_init registered (logs failures). */
typedef void (*duet_spank_client_exit_fn)(spank_t sp, const struct duet_spank_args* args);

#define DUET_SPANK_CLIENT_MODULE "duet_spank_client.so"

#ifdef __cplusplus
}
#endif

#endif /* DUET_SLURM_PLUGIN_CLIENT_ABI_H_ */
