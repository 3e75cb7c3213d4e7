#include "bridge/slurm/libslurm_client.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"

#include "common/slurm/slurm_compat.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace {

void InitSlurmOnce(const std::string& conf) {
  static std::once_flag once;
  std::call_once(once, [&conf] { slurm_init(conf.empty() ? nullptr : conf.c_str()); });
}

// The current libslurm error as a Status. `what` names the call.
absl::Status SlurmError(const std::string& what) {
  const int e = slurm_compat::LastError();
  const std::string msg = absl::StrCat(what, ": ", slurm_strerror(e), " (slurm errno ", e, ")");
  if (slurm_compat::IsCommError(e)) {
    return absl::UnavailableError(absl::StrCat("Slurm unreachable: ", msg));
  }
  if (e == SLURM_PROTOCOL_VERSION_ERROR) {
    // slurmctld older than this libslurm, or more than two releases newer.
    return absl::FailedPreconditionError(absl::StrCat(
        msg, ": slurmctld and this duet-bridge's libslurm ",
        FormatRelease(BuiltSlurmRelease()), " speak no common protocol version (support table: "
        "bridge/slurm/README.md)"));
  }
  switch (e) {
    case ESLURM_NODES_BUSY:
    case ESLURM_NOT_TOP_PRIORITY:
    case ESLURM_CAN_NOT_START_IMMEDIATELY:
    case ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE:
      return absl::ResourceExhaustedError(absl::StrCat("no room: ", msg));
    case ESLURM_NODE_NOT_AVAIL:
    case ESLURM_INVALID_NODE_STATE:
    case ESLURM_REQUESTED_PART_CONFIG_UNAVAILABLE:
      return absl::FailedPreconditionError(absl::StrCat("node not usable: ", msg));
    case ESLURM_INVALID_NODE_NAME:
    case ESLURM_INVALID_JOB_ID:
      return absl::NotFoundError(msg);
    case ESLURM_INVALID_GRES:
    case ESLURM_INVALID_GRES_TYPE:
    case ESLURM_INVALID_TRES:
      return absl::InvalidArgumentError(msg);
    case ESLURM_ACCESS_DENIED:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// PreemptMode as slurm.conf spells it ("OFF", "REQUEUE", "SUSPEND,GANG").
std::string PreemptModeString(uint16_t mode) {
  std::vector<std::string> parts;
  if (mode & PREEMPT_MODE_SUSPEND) parts.push_back("SUSPEND");
  if (mode & PREEMPT_MODE_REQUEUE) parts.push_back("REQUEUE");
  if (mode & PREEMPT_MODE_CANCEL) parts.push_back("CANCEL");
  if (mode & PREEMPT_MODE_GANG) parts.push_back("GANG");
  if (mode & PREEMPT_MODE_WITHIN) parts.push_back("WITHIN");
#ifdef PREEMPT_MODE_PRIORITY  // 23.11 and later
  if (mode & PREEMPT_MODE_PRIORITY) parts.push_back("PRIORITY");
#endif
  return parts.empty() ? "OFF" : absl::StrJoin(parts, ",");
}

std::vector<std::string> SplitFeatures(const char* s) {
  std::vector<std::string> out;
  if (s == nullptr) return out;
  for (absl::string_view f : absl::StrSplit(s, ',', absl::SkipEmpty())) out.emplace_back(f);
  std::sort(out.begin(), out.end());
  return out;
}

SlurmNodeInfo ToNodeInfo(const node_info_t& n) {
  SlurmNodeInfo info;
  info.name = n.name;
  if (n.node_addr) info.addr = n.node_addr;
  info.cpus = n.cpus;
  info.real_memory_mib = n.real_memory;
  if (n.gres) info.gres = ParseGres(n.gres);
  info.features = SplitFeatures(n.features);
  info.weight = n.weight;
  info.topology = slurm_compat::NodeTopology(n);
  if (n.reason) info.reason = n.reason;
  info.raw_state = n.node_state;
  const char* s = slurm_node_state_string(n.node_state);
  info.state = s ? s : "";
  const uint32_t base = n.node_state & NODE_STATE_BASE;
  info.future = base == NODE_STATE_FUTURE;
  info.down = base == NODE_STATE_DOWN;
  info.drain = (n.node_state & NODE_STATE_DRAIN) != 0;
  info.not_responding = (n.node_state & NODE_STATE_NO_RESPOND) != 0;
  info.busy = base == NODE_STATE_ALLOCATED || base == NODE_STATE_MIXED ||
              (n.node_state & NODE_STATE_COMPLETING) != 0;
  info.reboot = (n.node_state & (NODE_STATE_REBOOT_REQUESTED | NODE_STATE_REBOOT_ISSUED)) != 0;
  info.failing = (n.node_state & NODE_STATE_FAIL) != 0;
  info.powered_down = (n.node_state & (NODE_STATE_POWERED_DOWN | NODE_STATE_POWERING_DOWN |
                                       NODE_STATE_POWER_DOWN)) != 0;
  info.invalid_registration = (n.node_state & NODE_STATE_INVALID_REG) != 0;
  uint32_t cpus = 0;
  uint64_t memory_mib = 0;
  if (slurm_compat::NodeAllocated(n, &cpus, &memory_mib)) {
    info.alloc_cpus = cpus;
    info.alloc_memory_mib = memory_mib;
  }
  return info;
}

SlurmJobInfo ToJobInfo(const slurm_job_info_t& j) {
  SlurmJobInfo info;
  info.job_id = j.job_id;
  if (j.name) info.name = j.name;
  if (j.comment) info.comment = j.comment;
  if (j.nodes) info.nodes = j.nodes;
  switch (j.job_state & JOB_STATE_BASE) {
    case JOB_PENDING: info.state = SlurmJobState::kPending; break;
    case JOB_RUNNING: info.state = SlurmJobState::kRunning; break;
    case JOB_SUSPENDED: info.state = SlurmJobState::kSuspended; break;
    default: info.state = SlurmJobState::kFinished; break;
  }
  if (j.job_state & JOB_COMPLETING) info.state = SlurmJobState::kCompleting;
  info.preempted = (j.job_state & JOB_STATE_BASE) == JOB_PREEMPTED;
  if (info.state == SlurmJobState::kPending) {
    const char* r = slurm_compat::JobReasonString(j.state_reason);
    if (r) info.state_reason = r;
  }
  if (j.start_time > 0) info.start_time = absl::FromTimeT(j.start_time);
  info.cpus = j.num_cpus;
  if (j.pn_min_memory != NO_VAL64 && (j.pn_min_memory & MEM_PER_CPU) == 0) {
    info.memory_mib = j.pn_min_memory;
  }
  const std::vector<std::string> hosts = slurm_compat::ExpandHostlist(j.nodes);
  for (size_t i = 0; i < hosts.size(); ++i) {
    SlurmJobNodeDevices d;
    d.node = hosts[i];
    if (i < j.gres_detail_cnt && j.gres_detail_str && j.gres_detail_str[i]) {
      // A detail string we cannot read leaves the node's lists empty; the
      // caller compares counts before trusting them.
      (void)ParseGresDetail(j.gres_detail_str[i], &d);
    }
    info.devices.push_back(std::move(d));
  }
  return info;
}

absl::StatusOr<std::optional<SlurmNodeInfo>> LoadNode(const std::string& name) {
  node_info_msg_t* msg = nullptr;
  if (slurm_load_node_single(&msg, const_cast<char*>(name.c_str()),
                             SHOW_ALL | SHOW_FUTURE) != SLURM_SUCCESS) {
    absl::Status s = SlurmError(absl::StrCat("load node ", name));
    if (absl::IsNotFound(s)) return std::optional<SlurmNodeInfo>();
    return s;
  }
  std::optional<SlurmNodeInfo> out;
  for (uint32_t i = 0; msg && i < msg->record_count; ++i) {
    const node_info_t& n = msg->node_array[i];
    if (n.name != nullptr && name == n.name) {
      out = ToNodeInfo(n);
      break;
    }
  }
  slurm_free_node_info_msg(msg);
  return out;
}

absl::StatusOr<std::optional<SlurmJobInfo>> LoadJob(uint32_t job_id) {
  job_info_msg_t* msg = nullptr;
  if (slurm_compat::LoadJob(&msg, job_id, SHOW_DETAIL | SHOW_ALL) != SLURM_SUCCESS) {
    absl::Status s = SlurmError(absl::StrCat("load job ", job_id));
    if (absl::IsNotFound(s)) return std::optional<SlurmJobInfo>();
    return s;
  }
  std::optional<SlurmJobInfo> out;
  for (uint32_t i = 0; msg && i < msg->record_count; ++i) {
    if (msg->job_array[i].job_id == job_id) out = ToJobInfo(msg->job_array[i]);
  }
  slurm_free_job_info_msg(msg);
  return out;
}

}  // namespace

std::string FormatRelease(SlurmRelease r) {
  return absl::StrFormat("%d.%02d", r.major, r.minor);
}

std::optional<SlurmRelease> ParseSlurmRelease(absl::string_view version) {
  std::vector<absl::string_view> parts = absl::StrSplit(version, absl::MaxSplits('.', 2));
  SlurmRelease r;
  if (parts.size() < 2 || !absl::SimpleAtoi(parts[0], &r.major) ||
      !absl::SimpleAtoi(parts[1], &r.minor) || r.major <= 0 || r.minor <= 0 || r.minor > 12) {
    return std::nullopt;
  }
  return r;
}

SlurmRelease BuiltSlurmRelease() { return {slurm_compat::kMajor, slurm_compat::kMinor}; }

namespace {
// Position in Slurm's release sequence; -1 for a release that never was.
int ReleaseIndex(SlurmRelease r) {
  static constexpr SlurmRelease kBefore2405[] = {{20, 2}, {20, 11}, {21, 8},
                                                 {22, 5}, {23, 2},  {23, 11}};
  for (int i = 0; i < static_cast<int>(std::size(kBefore2405)); ++i) {
    if (kBefore2405[i] == r) return i;
  }
  // From 24.05 on, one release every May and one every November.
  if (r.major >= 24 && (r.minor == 5 || r.minor == 11)) {
    return static_cast<int>(std::size(kBefore2405)) + (r.major - 24) * 2 + (r.minor == 11);
  }
  return -1;
}
}  // namespace

bool ControllerSupported(SlurmRelease client, SlurmRelease ctld) {
  const int c = ReleaseIndex(client);
  const int s = ReleaseIndex(ctld);
  return c >= 0 && s >= 0 && s - c >= 0 && s - c <= 2;
}

std::string UnsupportedControllerMessage(SlurmRelease client, absl::string_view ctld_version) {
  return absl::StrCat(
      "slurmctld is Slurm ", ctld_version, ", but this duet-bridge was built against libslurm ",
      FormatRelease(client), ", which can only talk to slurmctld of its own release or the two "
      "after it: not talking to it (serving from the ledger). Run a duet-bridge built against "
      "that Slurm release's libslurm (support table: bridge/slurm/README.md)");
}

std::string SlurmNodeLine(const SlurmNodeConfig& c) {
  const std::string addr = c.addr.empty() ? c.name : c.addr;
  std::string line = absl::StrCat("NodeName=", c.name, " NodeAddr=", addr,
                                  " NodeHostname=", addr, " CPUs=", c.cpus,
                                  " RealMemory=", c.real_memory_mib);
  const std::string gres = FormatGres(c.gres);
  if (!gres.empty()) absl::StrAppend(&line, " Gres=", gres);
  if (!c.features.empty()) absl::StrAppend(&line, " Feature=", absl::StrJoin(c.features, ","));
  if (c.weight != 0) absl::StrAppend(&line, " Weight=", c.weight);
  if (slurm_compat::kNodeTopology && !c.topology.empty()) {
    absl::StrAppend(&line, " Topology=", c.topology);
  }
  absl::StrAppend(&line, " State=FUTURE");
  return line;
}

namespace {

// slurm_create_node with the node line of `config`. A node line whose
// Topology= slurmctld cannot place (no topology plugin that takes it, or a
// block its topology.conf/yaml does not name) is refused whole; then the
// node is created without it, so a block missing from the topology only
// costs Slurm that block's locality (the features still name it).
absl::Status CreateNodeLine(const SlurmNodeConfig& config) {
  std::string line = SlurmNodeLine(config);
  update_node_msg_t msg;
  slurm_init_update_node_msg(&msg);
  msg.extra = line.data();
  if (slurm_create_node(&msg) == SLURM_SUCCESS) return absl::OkStatus();
  const int e = slurm_compat::LastError();
  if (slurm_compat::IsNodeAlreadyExists(e)) {
    // Created by someone else since the check (24.11+ says so).
    return absl::AlreadyExistsError(
        absl::StrCat("create node ", config.name, ": already exists in Slurm"));
  }
  if (!config.topology.empty() && slurm_compat::kNodeTopology &&
      slurm_compat::IsTopologyUnavailable(e)) {
    spdlog::warn("slurm: node {}: slurmctld has no topology unit \"{}\" (topology.conf/yaml); "
                 "creating it without Topology=",
                 config.name, config.topology);
    SlurmNodeConfig plain = config;
    plain.topology.clear();
    return CreateNodeLine(plain);
  }
  return SlurmError(absl::StrCat("create node \"", line, "\""));
}

}  // namespace

LibSlurmClient::LibSlurmClient(LibSlurmClientOptions options)
    : options_(std::move(options)), stuck_(std::make_shared<std::atomic<int>>(0)) {
  InitSlurmOnce(options_.conf_path);
}

LibSlurmClient::~LibSlurmClient() = default;

template <typename T>
absl::StatusOr<T> LibSlurmClient::Run(const char* what, std::function<absl::StatusOr<T>()> fn) {
  if (stuck_->load() >= options_.max_stuck_calls) {
    return absl::UnavailableError(absl::StrCat("Slurm unreachable: ", what, ": ", stuck_->load(),
                                               " earlier calls still hang past their deadline"));
  }
  struct State {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    bool abandoned ABSL_GUARDED_BY(mu) = false;
    std::optional<absl::StatusOr<T>> result ABSL_GUARDED_BY(mu);
  };
  auto state = std::make_shared<State>();
  auto stuck = stuck_;
  std::thread([state, stuck, fn = std::move(fn)]() {
    absl::StatusOr<T> r = fn();
    absl::MutexLock lock(&state->mu);
    state->result.emplace(std::move(r));
    state->done = true;
    if (state->abandoned) stuck->fetch_sub(1);
  }).detach();
  absl::MutexLock lock(&state->mu);
  state->mu.AwaitWithTimeout(absl::Condition(&state->done), options_.call_timeout);
  if (!state->done) {
    state->abandoned = true;
    stuck_->fetch_add(1);
    return absl::UnavailableError(absl::StrCat("Slurm unreachable: ", what, ": no answer within ",
                                               absl::FormatDuration(options_.call_timeout)));
  }
  return std::move(*state->result);
}

absl::Status LibSlurmClient::RunStatus(const char* what, std::function<absl::Status()> fn) {
  absl::StatusOr<bool> r = Run<bool>(what, [fn = std::move(fn)]() -> absl::StatusOr<bool> {
    absl::Status s = fn();
    if (!s.ok()) return s;
    return true;
  });
  return r.status();
}

absl::Status LibSlurmClient::Ping() {
  absl::Status ping = RunStatus("ping", [] {
    if (slurm_ping(0) != SLURM_SUCCESS) return SlurmError("ping slurmctld");
    return absl::OkStatus();
  });
  if (!ping.ok()) {
    controller_checked_.store(false);
    return ping;
  }
  if (controller_checked_.load()) return absl::OkStatus();
  absl::StatusOr<std::string> version = ControllerVersion();
  if (!version.ok()) return version.status();
  const std::optional<SlurmRelease> ctld = ParseSlurmRelease(*version);
  if (!ctld.has_value() || !ControllerSupported(BuiltSlurmRelease(), *ctld)) {
    return absl::FailedPreconditionError(
        UnsupportedControllerMessage(BuiltSlurmRelease(), *version));
  }
  controller_checked_.store(true);
  return absl::OkStatus();
}

absl::StatusOr<std::string> LibSlurmClient::ControllerVersion() {
  absl::StatusOr<SlurmControllerInfo> info = Controller();
  if (!info.ok()) return info.status();
  return info->version;
}

absl::StatusOr<SlurmControllerInfo> LibSlurmClient::Controller() {
  return Run<SlurmControllerInfo>("load config", []() -> absl::StatusOr<SlurmControllerInfo> {
    slurm_conf_t* conf = nullptr;
    if (slurm_load_ctl_conf(0, &conf) != SLURM_SUCCESS) return SlurmError("load config");
    SlurmControllerInfo info;
    info.boot_time = static_cast<int64_t>(conf->boot_time);
    if (conf->version != nullptr) info.version = conf->version;
    slurm_compat::FreeCtlConf(conf);
    return info;
  });
}

absl::Status LibSlurmClient::Reconfigure() {
  return RunStatus("reconfigure", [] {
    if (slurm_reconfigure() != SLURM_SUCCESS) return SlurmError("reconfigure");
    return absl::OkStatus();
  });
}

absl::StatusOr<SlurmClusterConfig> LibSlurmClient::ClusterConfig() {
  return Run<SlurmClusterConfig>("load config", []() -> absl::StatusOr<SlurmClusterConfig> {
    slurm_conf_t* conf = nullptr;
    if (slurm_load_ctl_conf(0, &conf) != SLURM_SUCCESS) return SlurmError("load config");
    SlurmClusterConfig c;
    if (conf->preempt_type) c.preempt_type = conf->preempt_type;
    c.preempt_mode = PreemptModeString(conf->preempt_mode);
    c.preempt_params = slurm_compat::PreemptParams(*conf);
    if (conf->task_plugin) c.task_plugin = conf->task_plugin;
    // cgroup.conf as slurmctld read it: an opaque list of name/value pairs
    // that only slurm_print_key_pairs reads ("Name    = value" lines).
    if (conf->cgroup_conf != nullptr) {
      char* text = nullptr;
      size_t len = 0;
      if (FILE* f = open_memstream(&text, &len)) {
        char title[] = "";
        slurm_print_key_pairs(f, conf->cgroup_conf, title);
        std::fclose(f);
        for (absl::string_view line : absl::StrSplit(absl::string_view(text, len), '\n')) {
          std::pair<absl::string_view, absl::string_view> kv =
              absl::StrSplit(line, absl::MaxSplits('=', 1));
          if (absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(kv.first), "ConstrainDevices")) {
            c.constrain_devices =
                absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(kv.second), "yes");
          }
        }
      }
      std::free(text);
    }
    slurm_compat::FreeCtlConf(conf);
    return c;
  });
}

absl::StatusOr<std::vector<SlurmPartitionInfo>> LibSlurmClient::ListPartitions() {
  return Run<std::vector<SlurmPartitionInfo>>(
      "list partitions", []() -> absl::StatusOr<std::vector<SlurmPartitionInfo>> {
        partition_info_msg_t* msg = nullptr;
        if (slurm_load_partitions(0, &msg, SHOW_ALL) != SLURM_SUCCESS) {
          return SlurmError("load partitions");
        }
        std::vector<SlurmPartitionInfo> out;
        for (uint32_t i = 0; msg && i < msg->record_count; ++i) {
          const partition_info_t& p = msg->partition_array[i];
          SlurmPartitionInfo info;
          if (p.name) info.name = p.name;
          if (p.nodes) info.nodes = p.nodes;
          info.is_default = (p.flags & PART_FLAG_DEFAULT) != 0;
          info.hidden = (p.flags & PART_FLAG_HIDDEN) != 0;
          info.root_only = (p.flags & PART_FLAG_ROOT_ONLY) != 0;
          info.up = (p.state_up & PARTITION_UP) == PARTITION_UP;
          if (p.max_time != INFINITE && p.max_time != NO_VAL) info.max_time_min = p.max_time;
          if (p.preempt_mode != NO_VAL16) info.preempt_mode = PreemptModeString(p.preempt_mode);
          info.priority_tier = p.priority_tier;
          if (p.max_cpus_per_node != INFINITE && p.max_cpus_per_node != NO_VAL) {
            info.max_cpus_per_node = p.max_cpus_per_node;
          }
          out.push_back(std::move(info));
        }
        slurm_free_partition_info_msg(msg);
        return out;
      });
}

absl::StatusOr<std::vector<SlurmReservationInfo>> LibSlurmClient::ListReservations() {
  return Run<std::vector<SlurmReservationInfo>>(
      "list reservations", []() -> absl::StatusOr<std::vector<SlurmReservationInfo>> {
        reserve_info_msg_t* msg = nullptr;
        if (slurm_load_reservations(0, &msg) != SLURM_SUCCESS) {
          return SlurmError("load reservations");
        }
        std::vector<SlurmReservationInfo> out;
        for (uint32_t i = 0; msg && i < msg->record_count; ++i) {
          const reserve_info_t& r = msg->reservation_array[i];
          SlurmReservationInfo info;
          if (r.name) info.name = r.name;
          if (r.node_list) info.nodes = slurm_compat::ExpandHostlist(r.node_list);
          info.start = absl::FromTimeT(r.start_time);
          info.end = absl::FromTimeT(r.end_time);
          info.maint = (r.flags & RESERVE_FLAG_MAINT) != 0;
          info.ignore_jobs = (r.flags & RESERVE_FLAG_IGN_JOBS) != 0;
          if (r.users) info.users = r.users;
          if (r.accounts) info.accounts = r.accounts;
          out.push_back(std::move(info));
        }
        slurm_free_reservation_info_msg(msg);
        return out;
      });
}

absl::StatusOr<std::vector<SlurmNodeInfo>> LibSlurmClient::ListNodes() {
  return Run<std::vector<SlurmNodeInfo>>(
      "list nodes", []() -> absl::StatusOr<std::vector<SlurmNodeInfo>> {
        node_info_msg_t* msg = nullptr;
        if (slurm_load_node(0, &msg, SHOW_ALL | SHOW_FUTURE) != SLURM_SUCCESS) {
          return SlurmError("load nodes");
        }
        std::vector<SlurmNodeInfo> out;
        // record_count is MaxNodeCount; unused slots have no name.
        for (uint32_t i = 0; msg && i < msg->record_count; ++i) {
          if (msg->node_array[i].name != nullptr) out.push_back(ToNodeInfo(msg->node_array[i]));
        }
        slurm_free_node_info_msg(msg);
        return out;
      });
}

absl::StatusOr<std::optional<SlurmNodeInfo>> LibSlurmClient::GetNode(const std::string& name) {
  return Run<std::optional<SlurmNodeInfo>>("get node", [name] { return LoadNode(name); });
}

absl::Status LibSlurmClient::CreateNode(const SlurmNodeConfig& config) {
  if (config.name.empty()) return absl::InvalidArgumentError("create node: name is empty");
  return RunStatus("create node", [config] {
    auto existing = LoadNode(config.name);
    if (!existing.ok()) return existing.status();
    if (existing->has_value()) {
      return absl::AlreadyExistsError(
          absl::StrCat("create node ", config.name, ": already exists in Slurm"));
    }
    return CreateNodeLine(config);
  });
}

absl::Status LibSlurmClient::UpdateNode(const SlurmNodeUpdate& update) {
  return RunStatus("update node", [update] {
    update_node_msg_t msg;
    slurm_init_update_node_msg(&msg);
    std::string name = update.name;
    msg.node_names = name.data();
    std::string features;
    std::string reason;
    if (update.weight) msg.weight = *update.weight;
    if (update.features) {
      features = absl::StrJoin(*update.features, ",");
      msg.features = features.data();
      msg.features_act = features.data();
    }
    if (update.drain_reason) {
      if (update.drain_reason->empty()) {
        msg.node_state = NODE_RESUME;
      } else {
        reason = *update.drain_reason;
        msg.node_state = NODE_STATE_DRAIN;
        msg.reason = reason.data();
        slurm_compat::SetReasonUid(&msg, getuid());
      }
    }
    if (slurm_update_node(&msg) != SLURM_SUCCESS) {
      return SlurmError(absl::StrCat("update node ", update.name));
    }
    return absl::OkStatus();
  });
}

absl::Status LibSlurmClient::DeleteNode(const std::string& name) {
  return RunStatus("delete node", [name] {
    update_node_msg_t msg;
    slurm_init_update_node_msg(&msg);
    std::string n = name;
    msg.node_names = n.data();
    if (slurm_delete_node(&msg) != SLURM_SUCCESS) {
      absl::Status s = SlurmError(absl::StrCat("delete node ", name));
      if (slurm_compat::LastError() == ESLURM_NODES_BUSY) {
        return absl::FailedPreconditionError(
            absl::StrCat("delete node ", name, ": jobs are still on it"));
      }
      return s;
    }
    return absl::OkStatus();
  });
}

namespace {

// What every placeholder job (a pod's, a lend's, a gang's) asks of Slurm
// besides its nodes, CPUs and memory: its name, comment, GRES per node,
// partition, QOS and SPANK environment, held here so the job description's
// pointers stay valid; Apply sets them and the terms every placeholder shares.
class PlaceholderJobText {
 public:
  PlaceholderJobText(const std::string& job_name, const std::string& comment,
                     const std::string& partition, const std::string& qos,
                     const std::vector<std::string>& spank_env, uint32_t gpus_per_node,
                     uint32_t tpus_per_node)
      : name_(job_name), comment_(comment), partition_(partition), qos_(qos), env_(spank_env) {
    std::vector<std::string> tres;
    if (gpus_per_node) tres.push_back(absl::StrCat("gres:gpu:", gpus_per_node));
    if (tpus_per_node) tres.push_back(absl::StrCat("gres:tpu:", tpus_per_node));
    tres_per_node_ = absl::StrJoin(tres, ",");
    for (std::string& e : env_) env_ptrs_.push_back(e.data());
    env_ptrs_.push_back(nullptr);
  }
  PlaceholderJobText(const PlaceholderJobText&) = delete;
  PlaceholderJobText& operator=(const PlaceholderJobText&) = delete;

  const std::string& tres_per_node() const { return tres_per_node_; }

  void Apply(job_desc_msg_t* desc, uid_t uid, gid_t gid) {
    desc->name = name_.data();
    desc->comment = comment_.data();
    desc->tres_per_node = tres_per_node_.data();
    desc->immediate = 1;
    // An immediate allocation that is not the partition's top priority is
    // refused ("insufficient priority"), on any node, whenever any job
    // pends in the partition: a pod could never be placed beside a Slurm
    // queue. A placeholder runs at once or not at all (it never waits ahead
    // of anyone), so it gets the highest priority short of Slurm's special
    // values (NO_VAL, INFINITE); setting it needs an operator, which the
    // bridge is (it creates nodes).
    desc->priority = kPlaceholderPriority;
    // A placeholder lasts as long as its pod: no time limit of its own (a
    // partition whose MaxTime is finite refuses it; the start-up check,
    // placeholder_policy.h, says so), never requeued (a preempted one must
    // not come back later on other devices).
    desc->time_limit = INFINITE;
    desc->requeue = 0;
    if (!partition_.empty()) desc->partition = partition_.data();
    if (!qos_.empty()) desc->qos = qos_.data();
    // Required from 24.11 (ESLURM_MISSING_WORK_DIR); a placeholder runs nothing.
    desc->work_dir = work_dir_.data();
    desc->user_id = uid;
    desc->group_id = gid;
    if (!env_.empty()) {
      desc->spank_job_env = env_ptrs_.data();
      desc->spank_job_env_size = static_cast<uint32_t>(env_.size());
    }
  }

 private:
  std::string name_;
  std::string comment_;
  std::string partition_;
  std::string qos_;
  std::string work_dir_ = "/";
  std::vector<std::string> env_;
  std::vector<char*> env_ptrs_;
  std::string tres_per_node_;
};

}  // namespace

absl::StatusOr<SlurmAllocation> LibSlurmClient::AllocatePlaceholder(
    const SlurmAllocRequest& request) {
  if (request.node.empty()) return absl::InvalidArgumentError("allocate: node is empty");
  if (request.gpus == 0 && request.tpus == 0) {
    return absl::InvalidArgumentError("allocate: no GPUs or TPUs requested");
  }
  const uid_t uid = options_.job_uid >= 0 ? static_cast<uid_t>(options_.job_uid) : getuid();
  const gid_t gid = options_.job_gid >= 0 ? static_cast<gid_t>(options_.job_gid) : getgid();
  return Run<SlurmAllocation>("allocate", [request, uid, gid]() -> absl::StatusOr<SlurmAllocation> {
    PlaceholderJobText text(request.job_name, request.comment, request.partition, request.qos,
                            request.spank_env, request.gpus, request.tpus);
    const std::string& tres_per_node = text.tres_per_node();
    std::string node = request.node;

    job_desc_msg_t desc;
    slurm_init_job_desc_msg(&desc);
    text.Apply(&desc, uid, gid);
    desc.req_nodes = node.data();
    desc.min_nodes = 1;
    desc.max_nodes = 1;
    desc.num_tasks = 1;
    desc.min_cpus = std::max<uint32_t>(1, request.cpus);
    desc.cpus_per_task = static_cast<uint16_t>(std::max<uint32_t>(1, request.cpus));
    if (request.memory_mib > 0) desc.pn_min_memory = request.memory_mib;
    resource_allocation_response_msg_t* resp = nullptr;
    if (slurm_allocate_resources(&desc, &resp) != SLURM_SUCCESS || resp == nullptr) {
      return SlurmError(absl::StrCat("allocate ", tres_per_node, " on ", request.node));
    }
    SlurmAllocation alloc;
    alloc.job_id = slurm_compat::AllocationJobId(*resp);
    const bool granted = resp->node_list != nullptr && request.node == resp->node_list;
    slurm_free_resource_allocation_response_msg(resp);
    if (!granted) {
      // Immediate allocations are granted or refused; anything else (queued)
      // must not linger.
      slurm_compat::KillJob(alloc.job_id, SIGKILL, 0);
      return absl::ResourceExhaustedError(
          absl::StrCat("no room: allocate on ", request.node, ": not granted at once"));
    }
    auto job = LoadJob(alloc.job_id);
    if (!job.ok() || !job->has_value() || (*job)->devices.empty()) {
      slurm_compat::KillJob(alloc.job_id, SIGKILL, 0);
      return absl::UnavailableError(absl::StrCat("allocate on ", request.node, ": job ",
                                                 alloc.job_id, " granted but its devices could not "
                                                 "be read back; cancelled"));
    }
    alloc.devices = (*job)->devices[0];
    if (alloc.devices.gpus.size() != request.gpus || alloc.devices.tpus.size() != request.tpus) {
      slurm_compat::KillJob(alloc.job_id, SIGKILL, 0);
      return absl::InternalError(absl::StrCat(
          "allocate on ", request.node, ": job ", alloc.job_id, " got gpus [",
          FormatIndexList(alloc.devices.gpus), "] tpus [", FormatIndexList(alloc.devices.tpus),
          "], asked ", request.gpus, "/", request.tpus, " (does gres.conf list File= for each "
          "device?); cancelled"));
    }
    return alloc;
  });
}

absl::StatusOr<SlurmGangAllocation> LibSlurmClient::AllocateGang(const SlurmGangRequest& request) {
  if (request.nodes.empty()) return absl::InvalidArgumentError("allocate gang: no nodes");
  for (size_t i = 0; i < request.nodes.size(); ++i) {
    if (request.nodes[i].empty()) return absl::InvalidArgumentError("allocate gang: empty node");
    if (std::find(request.nodes.begin(), request.nodes.begin() + i, request.nodes[i]) !=
        request.nodes.begin() + i) {
      return absl::InvalidArgumentError(
          absl::StrCat("allocate gang: node ", request.nodes[i], " is listed twice"));
    }
  }
  if (request.gpus_per_node == 0 && request.tpus_per_node == 0) {
    return absl::InvalidArgumentError("allocate gang: no GPUs or TPUs requested");
  }
  const uid_t uid = options_.job_uid >= 0 ? static_cast<uid_t>(options_.job_uid) : getuid();
  const gid_t gid = options_.job_gid >= 0 ? static_cast<gid_t>(options_.job_gid) : getgid();
  return Run<SlurmGangAllocation>("allocate gang", [request, uid,
                                                    gid]() -> absl::StatusOr<SlurmGangAllocation> {
    PlaceholderJobText text(request.job_name, request.comment, request.partition, request.qos,
                            request.spank_env, request.gpus_per_node, request.tpus_per_node);
    const std::string& tres_per_node = text.tres_per_node();
    std::string node_list = absl::StrJoin(request.nodes, ",");
    const uint32_t n = static_cast<uint32_t>(request.nodes.size());
    const uint32_t cpus = std::max<uint32_t>(1, request.cpus_per_node);

    // As AllocatePlaceholder's job (PlaceholderJobText), over exactly
    // `nodes` (-w NODES -N n): one task per node with the node's CPUs, the
    // same GRES and memory per node.
    job_desc_msg_t desc;
    slurm_init_job_desc_msg(&desc);
    text.Apply(&desc, uid, gid);
    desc.req_nodes = node_list.data();
    desc.min_nodes = n;
    desc.max_nodes = n;
    desc.num_tasks = n;
    desc.ntasks_per_node = 1;
    desc.min_cpus = n * cpus;
    desc.cpus_per_task = static_cast<uint16_t>(cpus);
    if (request.memory_mib_per_node > 0) desc.pn_min_memory = request.memory_mib_per_node;
    resource_allocation_response_msg_t* resp = nullptr;
    if (slurm_allocate_resources(&desc, &resp) != SLURM_SUCCESS || resp == nullptr) {
      return SlurmError(absl::StrCat("allocate gang ", tres_per_node, " per node on ", node_list));
    }
    SlurmGangAllocation alloc;
    alloc.job_id = slurm_compat::AllocationJobId(*resp);
    std::vector<std::string> granted = slurm_compat::ExpandHostlist(resp->node_list);
    slurm_free_resource_allocation_response_msg(resp);
    std::vector<std::string> wanted = request.nodes;
    std::sort(granted.begin(), granted.end());
    std::sort(wanted.begin(), wanted.end());
    if (granted != wanted) {
      // Not granted at once (queued), or not on exactly these nodes: no job
      // may linger.
      slurm_compat::KillJob(alloc.job_id, SIGKILL, 0);
      return absl::ResourceExhaustedError(absl::StrCat(
          "no room: allocate gang on ", node_list, ": not granted at once on exactly those nodes"));
    }
    auto job = LoadJob(alloc.job_id);
    if (!job.ok() || !job->has_value()) {
      slurm_compat::KillJob(alloc.job_id, SIGKILL, 0);
      return absl::UnavailableError(absl::StrCat("allocate gang on ", node_list, ": job ",
                                                 alloc.job_id, " granted but its devices could not "
                                                 "be read back; cancelled"));
    }
    for (const std::string& node : request.nodes) {
      auto it = std::find_if((*job)->devices.begin(), (*job)->devices.end(),
                             [&node](const SlurmJobNodeDevices& d) { return d.node == node; });
      if (it == (*job)->devices.end() || it->gpus.size() != request.gpus_per_node ||
          it->tpus.size() != request.tpus_per_node) {
        slurm_compat::KillJob(alloc.job_id, SIGKILL, 0);
        return absl::InternalError(absl::StrCat(
            "allocate gang: job ", alloc.job_id, " on ", node, " got ",
            it == (*job)->devices.end()
                ? std::string("no devices")
                : absl::StrCat("gpus [", FormatIndexList(it->gpus), "] tpus [",
                               FormatIndexList(it->tpus), "]"),
            ", asked ", request.gpus_per_node, "/", request.tpus_per_node,
            " per node (does gres.conf list File= for each device?); cancelled"));
      }
      alloc.nodes.push_back(*it);
    }
    return alloc;
  });
}

absl::Status LibSlurmClient::KillJob(uint32_t job_id) {
  return RunStatus("kill job", [job_id] {
    if (slurm_compat::KillJob(job_id, SIGKILL, 0) != SLURM_SUCCESS) {
      const int e = slurm_compat::LastError();
      if (e == ESLURM_ALREADY_DONE || e == ESLURM_INVALID_JOB_ID) return absl::OkStatus();
      return SlurmError(absl::StrCat("kill job ", job_id));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<SlurmJobInfo>> LibSlurmClient::ListJobs() {
  return Run<std::vector<SlurmJobInfo>>("list jobs",
                                        []() -> absl::StatusOr<std::vector<SlurmJobInfo>> {
    job_info_msg_t* msg = nullptr;
    if (slurm_load_jobs(0, &msg, SHOW_DETAIL | SHOW_ALL) != SLURM_SUCCESS) {
      return SlurmError("load jobs");
    }
    std::vector<SlurmJobInfo> out;
    for (uint32_t i = 0; msg && i < msg->record_count; ++i) {
      out.push_back(ToJobInfo(msg->job_array[i]));
    }
    slurm_free_job_info_msg(msg);
    return out;
  });
}

absl::StatusOr<std::optional<SlurmJobInfo>> LibSlurmClient::GetJob(uint32_t job_id) {
  return Run<std::optional<SlurmJobInfo>>("get job", [job_id] { return LoadJob(job_id); });
}

}  // namespace duet
