/* A SPANK plugin that does nothing: bench/slurm/run_bench.sh's variant
 * "empty" (DUET_BENCH_EMPTY_SPANK), to tell what any plugin in plugstack.conf
 * costs a step (Slurm loading it into srun and slurmstepd) from what
 * spank_duet's own work costs. */
#include <slurm/spank.h>

SPANK_PLUGIN(duet_bench_empty, 1);

int slurm_spank_init(spank_t sp, int ac, char** av) {
  (void)sp;
  (void)ac;
  (void)av;
  return 0;
}
