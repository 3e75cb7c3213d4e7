#include "k8s_adapter/leader_election.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "k8s_adapter/kube_api.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace duet {
namespace k8s {

LeaderElector::LeaderElector(KubeClient* client, LeaderElectionOptions options)
    : client_(client), options_(std::move(options)) {}

LeaderElector::~LeaderElector() { Stop(); }

std::string LeaderElector::Path(bool item) const {
  std::string p = absl::StrCat("/apis/coordination.k8s.io/v1/namespaces/",
                               QueryEscape(options_.lease_namespace), "/leases");
  if (item) absl::StrAppend(&p, "/", QueryEscape(options_.lease_name));
  return p;
}

void LeaderElector::Start(std::function<void()> on_started, std::function<void()> on_stopped) {
  on_started_ = std::move(on_started);
  on_stopped_ = std::move(on_stopped);
  thread_ = std::thread([this] { Run(); });
}

void LeaderElector::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::string LeaderElector::observed_holder() const {
  absl::MutexLock l(&mu_);
  return observed_holder_;
}

bool LeaderElector::Sleep(absl::Duration d) {
  absl::MutexLock l(&mu_);
  options_.clock->AwaitWithTimeout(&mu_, absl::Condition(&stopping_), d);
  return !stopping_;
}

void LeaderElector::Run() {
  absl::Time last_renew = options_.clock->Now();
  while (true) {
    absl::Status s = TryAcquireOrRenew();
    {
      absl::MutexLock l(&mu_);
      if (stopping_) break;
    }
    const absl::Time now = options_.clock->Now();
    if (s.ok()) {
      last_renew = now;
      if (!leader_.exchange(true)) {
        spdlog::info("leader election: {} is now the leader of {}/{}", options_.identity,
                     options_.lease_namespace, options_.lease_name);
        if (on_started_) on_started_();
      }
    } else if (leader_.load() && now - last_renew > options_.renew_deadline) {
      spdlog::error("leader election: {} lost the lease: {}", options_.identity, std::string(s.ToString()));
      leader_ = false;
      if (on_stopped_) on_stopped_();
    }
    // Standbys spread their retries; the leader renews on the period.
    const double jitter = leader_.load() ? 1.0 : absl::Uniform(rng_, 1.0, 1.2);
    if (!Sleep(options_.retry_period * jitter)) break;
  }
  if (leader_.load()) {
    if (options_.release_on_stop) Release();
    leader_ = false;
    if (on_stopped_) on_stopped_();
  }
}

absl::Status LeaderElector::TryAcquireOrRenew() {
  const absl::Time now = options_.clock->Now();
  const std::string now_text = FormatMicroTime(now);
  const int64_t duration_s = std::max<int64_t>(1, absl::ToInt64Seconds(options_.lease_duration));
  absl::StatusOr<std::string> got = client_->Get(Path(true));
  if (got.status().code() == absl::StatusCode::kNotFound) {
    nlohmann::json lease = {
        {"apiVersion", "coordination.k8s.io/v1"},
        {"kind", "Lease"},
        {"metadata", {{"name", options_.lease_name}, {"namespace", options_.lease_namespace}}},
        {"spec",
         {{"holderIdentity", options_.identity},
          {"leaseDurationSeconds", duration_s},
          {"acquireTime", now_text},
          {"renewTime", now_text},
          {"leaseTransitions", 0}}}};
    return client_->Post(Path(false), lease.dump()).status();
  }
  if (!got.ok()) return got.status();
  nlohmann::json lease = nlohmann::json::parse(*got, nullptr, false);
  if (lease.is_discarded() || !lease.is_object()) return absl::InternalError("lease is not JSON");
  try {
    nlohmann::json& spec = lease["spec"];
    if (spec.is_null()) spec = nlohmann::json::object();
    const std::string holder = spec.value("holderIdentity", "");
    const std::string record = absl::StrCat(holder, "|", spec.value("renewTime", ""), "|",
                                            spec.value("leaseTransitions", 0));
    bool expired;
    {
      absl::MutexLock l(&mu_);
      if (record != observed_record_) {
        observed_record_ = record;
        observed_at_ = now;
      }
      observed_holder_ = holder;
      const int64_t held_for = spec.value("leaseDurationSeconds", duration_s);
      expired = holder.empty() || observed_at_ + absl::Seconds(held_for) < now;
    }
    const bool mine = holder == options_.identity;
    if (!mine && !expired) {
      return absl::FailedPreconditionError(absl::StrCat("lease held by ", holder));
    }
    if (!mine) {
      spec["acquireTime"] = now_text;
      spec["leaseTransitions"] = spec.value("leaseTransitions", 0) + 1;
    }
    spec["holderIdentity"] = options_.identity;
    spec["leaseDurationSeconds"] = duration_s;
    spec["renewTime"] = now_text;
    // metadata.resourceVersion stays: the update is refused (ABORTED) if
    // anyone wrote the lease since we read it.
    absl::StatusOr<std::string> put = client_->Put(Path(true), lease.dump());
    if (!put.ok()) return put.status();
    absl::MutexLock l(&mu_);
    observed_holder_ = options_.identity;
  } catch (const nlohmann::json::exception& e) {
    return absl::InternalError(absl::StrCat("lease has an unexpected shape: ", e.what()));
  }
  return absl::OkStatus();
}

void LeaderElector::Release() {
  absl::StatusOr<std::string> got = client_->Get(Path(true));
  if (!got.ok()) return;
  nlohmann::json lease = nlohmann::json::parse(*got, nullptr, false);
  if (!lease.is_object()) return;
  try {
    if (lease["spec"].value("holderIdentity", "") != options_.identity) return;
    // As client-go: an empty holder with a 1 s duration, so standbys see it
    // free at once.
    lease["spec"]["holderIdentity"] = "";
    lease["spec"]["leaseDurationSeconds"] = 1;
    lease["spec"]["renewTime"] = FormatMicroTime(options_.clock->Now());
  } catch (const nlohmann::json::exception&) {
    return;
  }
  absl::Status s = client_->Put(Path(true), lease.dump()).status();
  if (!s.ok()) spdlog::warn("leader election: releasing the lease: {}", std::string(s.ToString()));
}

}  // namespace k8s
}  // namespace duet
