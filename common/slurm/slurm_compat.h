#pragma once

// The one place where duet's code differs by libslurm release.
//
// duet builds from one source tree against Slurm 22.05 (Debian 12), 24.11
// (Debian 13), 25.11 (the GKE Slurm add-on, from source) and 26.05 (Debian
// forky). Every difference in the C API it uses is keyed here on
// SLURM_VERSION_NUMBER (slurm/slurm_version.h of the headers built against);
// the rest of bridge/slurm and slurm_plugin call these wrappers and have no
// version #if of their own. What changed, where (../shared/slurm/NEWER_SLURM.md
// has the measurements):
//
//   24.11  slurm_get_errno() removed (libslurm sets errno, also in 22.05);
//          hostlist_t is `struct hostlist`, no longer a pointer typedef;
//          socket error codes 5000-5002 removed; slurm_job_reason_string
//          exported as slurm_job_state_reason_string; duplicate node creation
//          fails with ESLURM_NODE_ALREADY_EXISTS.
//   25.05  node_info_t.alloc_cpus / alloc_memory replace the select plugin's
//          node data (select_nodeinfo, slurm_get_select_nodeinfo); node
//          lines (slurm_create_node, slurm.conf) take Topology=TOPO:UNIT and
//          node_info_t.topology_str reports it (docs/slurm-versions.md).
//   25.11  resource_allocation_response_msg_t.job_id moves to .step_id.job_id.
//   26.05  slurm_load_job / slurm_kill_job take a slurm_step_id_t (their
//          SLURM_BACKWARD_COMPAT wrappers use C11 _Generic, not C++);
//          slurm_free_ctl_conf renamed slurm_free_conf;
//          update_node_msg_t.reason_uid removed.
//
// Slurm releases between those (23.02, 23.11, 24.05) are not built or tested.
// Header-only: also compiled into duet_spank_client.so, which takes libslurm's
// symbols from slurmstepd.

#include <sys/types.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

extern "C" {
#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
#include <slurm/slurm_version.h>
}

#define DUET_SLURM_AT_LEAST(major, minor) \
  (SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(major, minor, 0))

extern "C" {
// Exported by libslurm but not declared in its public headers.
#if DUET_SLURM_AT_LEAST(24, 11)
const char* slurm_job_state_reason_string(enum job_state_reason inx);
#else
const char* slurm_job_reason_string(enum job_state_reason inx);
#endif
char* slurm_node_state_string(uint32_t inx);
}

namespace duet::slurm_compat {

// The release built against, e.g. 24 and 11.
inline constexpr int kMajor = SLURM_VERSION_MAJOR(SLURM_VERSION_NUMBER);
inline constexpr int kMinor = SLURM_VERSION_MINOR(SLURM_VERSION_NUMBER);
inline constexpr int kMicro = SLURM_VERSION_MICRO(SLURM_VERSION_NUMBER);

// The error of the last failed libslurm call. libslurm sets errno in every
// release; 22.05 also had slurm_get_errno(), removed in 24.11.
inline int LastError() { return errno; }

// Whether `e` says slurmctld could not be reached (or refused to talk for
// now): the communication error blocks, the socket errors (the block that
// starts at 5000 in 22.05 and at ESLURM_PROTOCOL_INCOMPLETE_PACKET from
// 24.11), 24.11's rate-limiting codes, and the system's connection errors
// (EPIPE: a slurmctld that is going down closed the connection while the
// request was being written).
inline bool IsCommError(int e) {
#if DUET_SLURM_AT_LEAST(24, 11)
  constexpr int kFirstSocketError = ESLURM_PROTOCOL_INCOMPLETE_PACKET;
  if (e == SLURMCTLD_COMMUNICATIONS_BACKOFF || e == SLURMCTLD_COMMUNICATIONS_HARD_DROP) {
    return true;
  }
#else
  constexpr int kFirstSocketError = SLURM_PROTOCOL_SOCKET_IMPL_ZERO_RECV_LENGTH;
#endif
  return (e >= SLURM_COMMUNICATIONS_CONNECTION_ERROR &&
          e <= SLURM_COMMUNICATIONS_MISSING_SOCKET_ERROR) ||
         (e >= SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR &&
          e <= SLURMCTLD_COMMUNICATIONS_SHUTDOWN_ERROR) ||
         (e >= kFirstSocketError && e <= SLURM_PROTOCOL_SOCKET_ZERO_BYTES_SENT) ||
         e == ECONNREFUSED || e == ETIMEDOUT || e == ECONNRESET || e == EHOSTUNREACH ||
         e == EPIPE || e == ECONNABORTED || e == ENETUNREACH ||
         e == SLURM_PROTOCOL_AUTHENTICATION_ERROR;
}

// Whether `e` says the node to create exists already. Before 24.11 a
// duplicate slurm_create_node succeeded.
inline bool IsNodeAlreadyExists(int e) {
#if DUET_SLURM_AT_LEAST(24, 11)
  return e == ESLURM_NODE_ALREADY_EXISTS;
#else
  (void)e;
  return false;
#endif
}

// Whether a node line may carry Topology=TOPOLOGY:UNIT (a dynamic node's
// block in topology/block, or its leaf switch in topology/tree): 25.05's
// read_config.c added the node parameter and create_nodes passes it to the
// topology plugin; older releases refuse the unknown key.
inline constexpr bool kNodeTopology = DUET_SLURM_AT_LEAST(25, 5);

// The node's Topology= as slurmctld reports it; empty before 25.05 or when
// the node has none.
inline std::string NodeTopology(const node_info_t& n) {
#if DUET_SLURM_AT_LEAST(25, 5)
  return n.topology_str != nullptr ? n.topology_str : "";
#else
  (void)n;
  return "";
#endif
}

// Whether `e` says the topology a node line named is not configured in
// slurmctld (no such block, or no topology plugin that takes it).
inline bool IsTopologyUnavailable(int e) {
#if DUET_SLURM_AT_LEAST(25, 5)
  return e == ESLURM_REQUESTED_TOPO_CONFIG_UNAVAILABLE;
#else
  (void)e;
  return false;
#endif
}

// A Slurm host list expression ("n[1-3],m") expanded; empty on a bad one.
inline std::vector<std::string> ExpandHostlist(const char* expr) {
  std::vector<std::string> out;
  if (expr == nullptr || *expr == '\0') return out;
  // A pointer in every release: hostlist_t was one until 24.11, then became
  // the struct itself, and slurm_hostlist_create returns hostlist_t *.
  auto* hl = slurm_hostlist_create(expr);
  if (hl == nullptr) return out;
  while (char* h = slurm_hostlist_shift(hl)) {
    out.emplace_back(h);
    free(h);
  }
  slurm_hostlist_destroy(hl);
  return out;
}

// A pending job's reason as `squeue` prints it, or null.
inline const char* JobReasonString(uint32_t reason) {
  const auto r = static_cast<enum job_state_reason>(reason);
#if DUET_SLURM_AT_LEAST(24, 11)
  return slurm_job_state_reason_string(r);
#else
  return slurm_job_reason_string(r);
#endif
}

// CPUs and memory (MiB) that jobs hold on a node: `scontrol show node`'s
// CPUAlloc and AllocMem. False when Slurm did not report them.
inline bool NodeAllocated(const node_info_t& n, uint32_t* cpus, uint64_t* memory_mib) {
#if DUET_SLURM_AT_LEAST(25, 5)
  *cpus = n.alloc_cpus;
  *memory_mib = n.alloc_memory;
  return true;
#else
  if (n.select_nodeinfo == nullptr) return false;
  uint16_t c = 0;
  uint64_t mem = 0;  // the plugin writes a uint64_t whatever the header says
  if (slurm_get_select_nodeinfo(n.select_nodeinfo, SELECT_NODEDATA_SUBCNT, NODE_STATE_ALLOCATED,
                                &c) != SLURM_SUCCESS ||
      slurm_get_select_nodeinfo(n.select_nodeinfo, SELECT_NODEDATA_MEM_ALLOC,
                                NODE_STATE_ALLOCATED, &mem) != SLURM_SUCCESS) {
    return false;
  }
  *cpus = c;
  *memory_mib = mem;
  return true;
#endif
}

#if DUET_SLURM_AT_LEAST(26, 5)
// The whole job (no step, no heterogeneous component), by job id.
inline slurm_step_id_t WholeJob(uint32_t job_id) {
  slurm_step_id_t id{};
  id.job_id = job_id;
  id.step_id = NO_VAL;
  id.step_het_comp = NO_VAL;
  return id;
}
#endif

// slurm_load_job of one job id (SLURM_SUCCESS or SLURM_ERROR with errno).
inline int LoadJob(job_info_msg_t** msg, uint32_t job_id, uint16_t show_flags) {
#if DUET_SLURM_AT_LEAST(26, 5)
  return slurm_load_job(msg, WholeJob(job_id), show_flags);
#else
  return slurm_load_job(msg, job_id, show_flags);
#endif
}

// slurm_kill_job of a whole job (SLURM_SUCCESS or SLURM_ERROR with errno).
inline int KillJob(uint32_t job_id, uint16_t signal, uint16_t flags) {
#if DUET_SLURM_AT_LEAST(26, 5)
  return slurm_kill_job(WholeJob(job_id), signal, flags);
#else
  return slurm_kill_job(job_id, signal, flags);
#endif
}

// The job id of a granted allocation.
inline uint32_t AllocationJobId(const resource_allocation_response_msg_t& r) {
#if DUET_SLURM_AT_LEAST(25, 11)
  return r.step_id.job_id;
#else
  return r.job_id;
#endif
}

// Frees what slurm_load_ctl_conf returned.
inline void FreeCtlConf(slurm_conf_t* conf) {
#if DUET_SLURM_AT_LEAST(26, 5)
  slurm_free_conf(conf);
#else
  slurm_free_ctl_conf(conf);
#endif
}

// Records who set a node's reason, where the message still carries it
// (26.05 dropped the field).
inline void SetReasonUid(update_node_msg_t* msg, uid_t uid) {
#if DUET_SLURM_AT_LEAST(26, 5)
  (void)msg;
  (void)uid;
#else
  msg->reason_uid = uid;
#endif
}

// PreemptParameters (min_exempt_priority, ...); "" before 23.02, which had
// no such setting.
inline std::string PreemptParams(const slurm_conf_t& conf) {
#if DUET_SLURM_AT_LEAST(23, 2)
  return conf.preempt_params != nullptr ? conf.preempt_params : "";
#else
  (void)conf;
  return "";
#endif
}

}  // namespace duet::slurm_compat
