#include "tests/fakes/fake_slurm.h"

#include <utility>

namespace duet {
namespace fakes {

FakeSlurmClient::FakeSlurmClient(uint32_t gpus_per_node, uint32_t first_job_id)
    : gpus_per_node_(gpus_per_node), next_job_(first_job_id) {}

absl::Status FakeSlurmClient::Ping() {
  absl::MutexLock l(&mu_);
  return ping_;
}

absl::StatusOr<std::vector<SlurmNodeInfo>> FakeSlurmClient::ListNodes() {
  absl::MutexLock l(&mu_);
  ++calls_;
  std::vector<SlurmNodeInfo> out;
  for (const auto& [name, node] : nodes_) out.push_back(node);
  return out;
}

absl::StatusOr<std::optional<SlurmNodeInfo>> FakeSlurmClient::GetNode(const std::string& name) {
  absl::MutexLock l(&mu_);
  ++calls_;
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return std::optional<SlurmNodeInfo>();
  return std::optional<SlurmNodeInfo>(it->second);
}

void FakeSlurmClient::add_node(SlurmNodeInfo node) {
  absl::MutexLock l(&mu_);
  nodes_[node.name] = std::move(node);
}

absl::Status FakeSlurmClient::CreateNode(const SlurmNodeConfig&) {
  absl::MutexLock l(&mu_);
  ++calls_;
  return absl::OkStatus();
}

absl::Status FakeSlurmClient::UpdateNode(const SlurmNodeUpdate&) {
  absl::MutexLock l(&mu_);
  ++calls_;
  return absl::OkStatus();
}

absl::Status FakeSlurmClient::DeleteNode(const std::string&) {
  absl::MutexLock l(&mu_);
  ++calls_;
  return absl::OkStatus();
}

absl::StatusOr<SlurmAllocation> FakeSlurmClient::AllocatePlaceholder(const SlurmAllocRequest& r) {
  absl::MutexLock l(&mu_);
  ++calls_;
  asked_.push_back(r);
  if (allocation_.has_value()) return *allocation_;
  std::set<uint32_t>& used = used_[r.node];
  SlurmAllocation a;
  a.devices.node = r.node;
  for (uint32_t i = 0; i < gpus_per_node_ && a.devices.gpus.size() < r.gpus; ++i) {
    if (used.count(i) == 0) a.devices.gpus.push_back(i);
  }
  if (a.devices.gpus.size() < r.gpus) {
    return absl::ResourceExhaustedError("Requested node configuration is not available");
  }
  a.job_id = next_job_++;
  for (uint32_t g : a.devices.gpus) used.insert(g);
  jobs_[a.job_id] = {a.devices};
  return a;
}

absl::StatusOr<SlurmGangAllocation> FakeSlurmClient::AllocateGang(const SlurmGangRequest& r) {
  absl::MutexLock l(&mu_);
  ++calls_;
  asked_gangs_.push_back(r);
  if (r.nodes.empty() || (r.gpus_per_node == 0 && r.tpus_per_node == 0)) {
    return absl::InvalidArgumentError("allocate gang: no nodes or no devices");
  }
  SlurmGangAllocation a;
  for (const std::string& node : r.nodes) {
    const std::set<uint32_t>& used = used_[node];
    SlurmJobNodeDevices d;
    d.node = node;
    for (uint32_t i = 0; i < gpus_per_node_ && d.gpus.size() < r.gpus_per_node; ++i) {
      if (used.count(i) == 0) d.gpus.push_back(i);
    }
    if (d.gpus.size() < r.gpus_per_node || r.tpus_per_node > 0) {
      return absl::ResourceExhaustedError("Requested node configuration is not available");
    }
    a.nodes.push_back(std::move(d));
  }
  a.job_id = next_job_++;
  for (const SlurmJobNodeDevices& d : a.nodes) {
    for (uint32_t g : d.gpus) used_[d.node].insert(g);
  }
  jobs_[a.job_id] = a.nodes;
  return a;
}

absl::Status FakeSlurmClient::KillJob(uint32_t job_id) {
  absl::MutexLock l(&mu_);
  ++calls_;
  killed_.push_back(job_id);
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) {
    for (const SlurmJobNodeDevices& d : it->second) {
      for (uint32_t g : d.gpus) used_[d.node].erase(g);
    }
    jobs_.erase(it);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SlurmJobInfo>> FakeSlurmClient::ListJobs() {
  absl::MutexLock l(&mu_);
  ++calls_;
  std::vector<SlurmJobInfo> out;
  for (const auto& [id, job] : listed_jobs_) out.push_back(job);
  return out;
}

void FakeSlurmClient::add_job(SlurmJobInfo job) {
  absl::MutexLock l(&mu_);
  listed_jobs_[job.job_id] = std::move(job);
}

void FakeSlurmClient::remove_job(uint32_t job_id) {
  absl::MutexLock l(&mu_);
  listed_jobs_.erase(job_id);
}

absl::StatusOr<std::optional<SlurmJobInfo>> FakeSlurmClient::GetJob(uint32_t) {
  absl::MutexLock l(&mu_);
  ++calls_;
  return std::optional<SlurmJobInfo>();
}

void FakeSlurmClient::Use(const std::string& node, uint32_t first, uint32_t n) {
  absl::MutexLock l(&mu_);
  for (uint32_t i = first; i < first + n; ++i) used_[node].insert(i);
}

void FakeSlurmClient::set_allocation(absl::StatusOr<SlurmAllocation> result) {
  absl::MutexLock l(&mu_);
  allocation_ = std::move(result);
}

void FakeSlurmClient::set_ping(absl::Status status) {
  absl::MutexLock l(&mu_);
  ping_ = std::move(status);
}

void FakeSlurmClient::set_next_job_id(uint32_t id) {
  absl::MutexLock l(&mu_);
  next_job_ = id;
}

size_t FakeSlurmClient::live_jobs() const {
  absl::MutexLock l(&mu_);
  return jobs_.size();
}

std::vector<SlurmAllocRequest> FakeSlurmClient::asked() const {
  absl::MutexLock l(&mu_);
  return asked_;
}

std::vector<SlurmGangRequest> FakeSlurmClient::asked_gangs() const {
  absl::MutexLock l(&mu_);
  return asked_gangs_;
}

std::vector<uint32_t> FakeSlurmClient::killed() const {
  absl::MutexLock l(&mu_);
  return killed_;
}

int FakeSlurmClient::calls_but_ping() const {
  absl::MutexLock l(&mu_);
  return calls_;
}

}  // namespace fakes
}  // namespace duet
