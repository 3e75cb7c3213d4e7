#include "k8s_adapter/device_plugin/step_agent.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/credential/munge_payload.h"
#include "common/credential/slurm_key_cred.h"
#include "common/grpc/status.h"
#include "common/reason.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace node {
namespace {

// A slow or silent peer never holds a thread longer than this per read or
// write.
constexpr int kIoTimeoutS = 5;

bool ReadAll(int fd, uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

void CopyCut(char* dst, size_t cap, const std::string& s, bool ellipsis) {
  if (s.size() < cap) {
    memcpy(dst, s.c_str(), s.size() + 1);
    return;
  }
  const size_t keep = cap - 1 - (ellipsis ? 3 : 0);
  memcpy(dst, s.data(), keep);
  if (ellipsis) memcpy(dst + keep, "...", 3);
  dst[cap - 1] = '\0';
}

void SendReply(int fd, const duet_wire_reply& reply) {
  std::vector<uint8_t> buf(DUET_WIRE_MAX_FRAME);
  char err[256];
  const long n = duet_wire_encode_reply(&reply, buf.data(), buf.size(), err, sizeof(err));
  if (n < 0) {
    spdlog::error("step agent: cannot encode a reply: {}", err);
    return;
  }
  if (!WriteAll(fd, buf.data(), static_cast<size_t>(n))) {
    spdlog::warn("step agent: the step left before its reply: {}", strerror(errno));
  }
}

duet_wire_reply Refusal(grpc::StatusCode code, const std::string& message) {
  return ReplyOf(grpc::Status(code, message), "step agent");
}

// The answer to a release put on the queue: OK, metadata queued=1.
duet_wire_reply Queued() {
  duet_wire_reply reply;
  memset(&reply, 0, sizeof(reply));
  reply.n_meta = 1;
  CopyCut(reply.meta[0].key, sizeof(reply.meta[0].key), "queued", false);
  CopyCut(reply.meta[0].value, sizeof(reply.meta[0].value), "1", false);
  return reply;
}

// The bridge out of reach: worth asking again (the plugin's "unreachable").
bool Retryable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// "step 12.0 on gke-a-1" / "job 12 on gke-a-1", for the log.
std::string ReleaseName(const StepCall& c) {
  const v1::Owner& o = c.release_request.owner();
  return o.has_slurm_job()
             ? absl::StrCat("job ", o.slurm_job().job_id(), " on ", c.release_request.node())
             : absl::StrCat("step ", o.slurm_step().job_id(), ".", o.slurm_step().step_id(),
                            " on ", c.release_request.node());
}

}  // namespace

StepCall StepCallOf(const duet_wire_request& r, absl::Duration default_timeout) {
  StepCall c;
  c.hold = r.type == DUET_WIRE_HOLD_STEP;
  v1::Owner owner;
  if (r.type == DUET_WIRE_RELEASE_JOB) {
    owner.mutable_slurm_job()->set_job_id(r.job_id);
  } else {
    owner.mutable_slurm_step()->set_job_id(r.job_id);
    owner.mutable_slurm_step()->set_step_id(r.step_id);
  }
  if (c.hold) {
    c.hold_request.set_node(r.node);
    *c.hold_request.mutable_owner() = owner;
    auto* list = c.hold_request.mutable_devices();
    for (uint32_t i = 0; i < r.n_gpus && i < DUET_WIRE_MAX_DEVICES; ++i) {
      auto* d = list->add_devices();
      d->set_kind(v1::DEVICE_KIND_GPU);
      d->set_index(r.gpus[i]);
    }
  } else {
    c.release_request.set_node(r.node);
    *c.release_request.mutable_owner() = owner;
  }
  if (r.cred_kind == DUET_WIRE_CRED_MUNGE) c.credential_key = slurm_munge::kMetadataKey;
  if (r.cred_kind == DUET_WIRE_CRED_SLURM_KEY) c.credential_key = slurm_key::kMetadataKey;
  if (!c.credential_key.empty()) c.credential = r.cred;
  c.timeout = r.timeout_ms > 0 ? absl::Milliseconds(r.timeout_ms) : default_timeout;
  return c;
}

duet_wire_reply ReplyOf(const grpc::Status& status, const char* method) {
  duet_wire_reply reply;
  memset(&reply, 0, sizeof(reply));
  reply.code = static_cast<uint32_t>(status.error_code());
  if (status.ok()) return reply;
  const absl::Status s = FromGrpc(status, method);
  CopyCut(reply.message, sizeof(reply.message), std::string(s.message()), true);
  CopyCut(reply.reason, sizeof(reply.reason), ReasonOf(s), false);
  for (const auto& [k, v] : ReasonMetadata(s)) {
    if (reply.n_meta == DUET_WIRE_MAX_META) break;
    if (k.empty() || k.size() > DUET_WIRE_MAX_META_KEY) continue;
    duet_wire_meta& m = reply.meta[reply.n_meta++];
    CopyCut(m.key, sizeof(m.key), k, false);
    CopyCut(m.value, sizeof(m.value), v, false);
  }
  return reply;
}

absl::StatusOr<std::unique_ptr<StepAgent>> StepAgent::Start(const std::string& socket_path,
                                                             StepForwarder forward,
                                                             absl::Duration default_timeout) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path[0] != '/' ||
      socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--step-agent-socket \"", socket_path, "\": an absolute path of at most ",
        sizeof(addr.sun_path) - 1, " bytes"));
  }
  memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  struct stat st {};
  if (lstat(socket_path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    unlink(socket_path.c_str());  // a socket an earlier duet-node left
  }
  const mode_t old_umask = umask(0177);  // 0600: root's, as slurmstepd calls as root
  const int b = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  umask(old_umask);
  if (b != 0 || listen(fd, 128) != 0) {
    const int e = b != 0 ? bind_errno : errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("--step-agent-socket ", socket_path, ": cannot listen: ", strerror(e)));
  }
  std::unique_ptr<StepAgent> agent(
      new StepAgent(socket_path, fd, std::move(forward), default_timeout));
  agent->accept_thread_ = std::thread([a = agent.get()] { a->AcceptLoop(); });
  agent->send_thread_ = std::thread([a = agent.get()] { a->SendLoop(); });
  spdlog::info("step agent listening on {}", socket_path);
  return agent;
}

StepAgent::StepAgent(std::string socket_path, int fd, StepForwarder forward,
                     absl::Duration default_timeout)
    : socket_path_(std::move(socket_path)),
      listen_fd_(fd),
      forward_(std::move(forward)),
      default_timeout_(default_timeout) {}

StepAgent::~StepAgent() { Stop(); }

void StepAgent::Stop() {
  {
    absl::MutexLock lock(&flights_->mu);
    if (flights_->stopping) return;
    flights_->stopping = true;
  }
  shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  if (accept_thread_.joinable()) accept_thread_.join();
  close(listen_fd_);
  unlink(socket_path_.c_str());
  {
    absl::MutexLock lock(&flights_->mu);
    flights_->mu.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &flights_->in_flight));
  }
  // No connection can queue a release now: what is queued gets kStopDrain.
  {
    absl::MutexLock lock(&queue_mu_);
    draining_ = true;
    drain_until_ = absl::Now() + kStopDrain;
  }
  if (send_thread_.joinable()) send_thread_.join();
}

size_t StepAgent::QueuedReleases() const {
  absl::MutexLock lock(&queue_mu_);
  return queue_.size() + (sending_ ? 1 : 0);
}

bool StepAgent::Enqueue(StepCall* call) {
  absl::MutexLock lock(&queue_mu_);
  if (queue_.size() + (sending_ ? 1 : 0) >= kMaxQueuedReleases) return false;
  queue_.push_back(QueuedRelease{std::move(*call), absl::Now()});
  return true;
}

bool StepAgent::HasWork() const { return !queue_.empty() || draining_; }

void StepAgent::SendLoop() {
  for (;;) {
    QueuedRelease r;
    bool draining = false;
    {
      absl::MutexLock lock(&queue_mu_);
      queue_mu_.Await(absl::Condition(this, &StepAgent::HasWork));
      if (queue_.empty()) return;  // draining, and nothing left
      if (draining_ && absl::Now() >= drain_until_) {
        for (const QueuedRelease& left : queue_) {
          spdlog::warn("step agent: release of {} not sent before duet-node stopped (job import "
                       "releases it once the job has ended)",
                       ReleaseName(left.call));
        }
        queue_.clear();
        return;
      }
      r = std::move(queue_.front());
      queue_.pop_front();
      sending_ = true;
      draining = draining_;
    }
    absl::Duration pause = kRetryFirstPause;
    int tries = 0;
    grpc::Status s;
    for (;;) {
      s = forward_(r.call);
      ++tries;
      if (!Retryable(s) || draining || absl::Now() + pause > r.queued_at + kReleaseRetryFor) break;
      // Out of reach: ask again after a pause (Stop cuts it short).
      absl::MutexLock lock(&queue_mu_);
      queue_mu_.AwaitWithTimeout(absl::Condition(&draining_), pause);
      draining = draining_;
      pause = std::min(pause * 2, kRetryMaxPause);
    }
    if (s.ok()) {
      spdlog::debug("step agent: released {} ({} tries, {} after the step asked)",
                    ReleaseName(r.call), tries, absl::FormatDuration(absl::Now() - r.queued_at));
    } else {
      spdlog::warn("step agent: release of {} failed after {} tries: {} (job import releases it "
                   "once the job has ended)",
                   ReleaseName(r.call), tries, std::string(FromGrpc(s, "Release").message()));
    }
    absl::MutexLock lock(&queue_mu_);
    sending_ = false;
  }
}

void StepAgent::AcceptLoop() {
  for (;;) {
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      absl::MutexLock lock(&flights_->mu);
      if (flights_->stopping) return;
      spdlog::error("step agent: accept: {}", strerror(errno));
      continue;
    }
    timeval tv{kIoTimeoutS, 0};
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    bool busy = false;
    {
      absl::MutexLock lock(&flights_->mu);
      if (flights_->stopping) {
        close(conn);
        return;
      }
      busy = flights_->in_flight >= kMaxInFlight;
      if (!busy) ++flights_->in_flight;
    }
    if (busy) {
      SendReply(conn, Refusal(grpc::StatusCode::UNAVAILABLE,
                              absl::StrCat("duet-node's step agent has ", kMaxInFlight,
                                           " calls in flight")));
      close(conn);
      continue;
    }
    std::thread([this, conn, flights = flights_] {
      Serve(conn);
      close(conn);
      absl::MutexLock lock(&flights->mu);
      --flights->in_flight;
    }).detach();
  }
}

void StepAgent::Serve(int conn) {
  std::vector<uint8_t> frame(DUET_WIRE_MAX_FRAME);
  char err[256] = "";
  uint8_t type = 0;
  uint32_t body = 0;
  if (!ReadAll(conn, frame.data(), DUET_WIRE_HEADER)) return;  // a probe, or a dead step
  if (duet_wire_parse_header(frame.data(), DUET_WIRE_HEADER, &type, &body, err, sizeof(err)) !=
          0 ||
      !ReadAll(conn, frame.data() + DUET_WIRE_HEADER, body)) {
    if (err[0] == '\0') snprintf(err, sizeof(err), "step agent frame refused: short body");
    spdlog::warn("step agent: {}", err);
    SendReply(conn, Refusal(grpc::StatusCode::INVALID_ARGUMENT, err));
    return;
  }
  duet_wire_request request;
  if (duet_wire_decode_request(frame.data(), DUET_WIRE_HEADER + body, &request, err,
                               sizeof(err)) != 0) {
    spdlog::warn("step agent: {}", err);
    SendReply(conn, Refusal(grpc::StatusCode::INVALID_ARGUMENT, err));
    return;
  }
  StepCall call = StepCallOf(request, default_timeout_);
  memset(request.cred, 0, sizeof(request.cred));
  if (!call.hold) {
    // Off the step's path: answered now, sent by SendLoop.
    const std::string name = ReleaseName(call);
    if (Enqueue(&call)) {
      SendReply(conn, Queued());
      return;
    }
    spdlog::warn("step agent: {} releases queued; the release of {} is sent while its step waits",
                 kMaxQueuedReleases, name);
  }
  const absl::Time start = absl::Now();
  const grpc::Status s = forward_(call);
  // --log-level debug shows where a step's Hold goes (bench/slurm/RESULTS.md).
  spdlog::debug("step agent: {} forwarded, bridge answered {} in {:.2f} ms",
                call.hold ? "Hold" : "Release", static_cast<int>(s.error_code()),
                absl::ToDoubleMilliseconds(absl::Now() - start));
  SendReply(conn, ReplyOf(s, call.hold ? "Hold" : "Release"));
}

}  // namespace node
}  // namespace duet
