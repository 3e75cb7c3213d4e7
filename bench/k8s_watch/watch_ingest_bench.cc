// Watch ingest: how fast duet::k8s's Informer applies list and watch traffic
// for a big cluster, and what it costs in memory.
//
// An in-process HTTP/1.1 server (plain sockets, one thread per connection)
// serves /api/v1/nodes and /api/v1/pods as the apiserver does: paged lists
// (limit/continue) then one chunked watch stream of MODIFIED frames generated
// on the fly (so the server holds no big buffers), then an idle watch. The
// client side is the real stack: libcurl KubeClient → Informer → handler
// (KubeNodeInventory for nodes; a compact pod table for pods).
//
//   watch_ingest_bench [--nodes 5000] [--pods 50000] [--node-events 20000]
//                      [--pod-events 200000]
// Prints one JSON object with the figures.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "k8s_adapter/informer.h"
#include "k8s_adapter/reconcile/node_inventory.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace duet {
namespace k8s {
namespace {

int64_t Kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::atoll(line.c_str() + strlen(field));
  }
  return -1;
}

std::string NodeTemplate() {
  // The A3 golden node, trimmed to what varies.
  nlohmann::json n = {
      {"kind", "Node"},
      {"apiVersion", "v1"},
      {"metadata",
       {{"name", "@NAME@"},
        {"uid", "0b9b5c0e-6a4e-4a1f-9d43-@UID@"},
        {"resourceVersion", "@RV@"},
        {"creationTimestamp", "2026-11-30T09:12:44Z"},
        {"labels",
         {{"beta.kubernetes.io/arch", "amd64"},
          {"beta.kubernetes.io/instance-type", "a3-highgpu-8g"},
          {"cloud.google.com/gce-topology-block", "a1b2c3d4e5f60718293a4b5c6d7e8f90"},
          {"cloud.google.com/gce-topology-subblock", "9a8b7c6d5e4f30211203f4e5d6c7b8a9"},
          {"cloud.google.com/gke-accelerator", "nvidia-h100-80gb"},
          {"cloud.google.com/gke-nodepool", "shared-h100"},
          {"cloud.google.com/gke-os-distribution", "cos"},
          {"cloud.google.com/machine-family", "a3"},
          {"duet.dev/shared", "true"},
          {"kubernetes.io/hostname", "@NAME@"},
          {"node.kubernetes.io/instance-type", "a3-highgpu-8g"},
          {"topology.kubernetes.io/region", "us-central1"},
          {"topology.kubernetes.io/zone", "us-central1-a"}}},
        {"annotations", {{"node.alpha.kubernetes.io/ttl", "0"}}}}},
      {"spec",
       {{"podCIDR", "10.64.3.0/24"},
        {"providerID", "gce://duet-dev/us-central1-a/@NAME@"},
        {"taints", {{{"key", "nvidia.com/gpu"}, {"value", "present"}, {"effect", "NoSchedule"}}}}}},
      {"status",
       {{"capacity",
         {{"cpu", "208"}, {"memory", "1871733496Ki"}, {"nvidia.com/gpu", "8"}, {"pods", "110"}}},
        {"allocatable",
         {{"cpu", "207690m"}, {"memory", "1857318648Ki"}, {"nvidia.com/gpu", "8"}, {"pods", "110"}}},
        {"conditions",
         {{{"type", "MemoryPressure"}, {"status", "False"}, {"lastHeartbeatTime", "@HB@"},
           {"reason", "KubeletHasSufficientMemory"}},
          {{"type", "DiskPressure"}, {"status", "False"}, {"lastHeartbeatTime", "@HB@"},
           {"reason", "KubeletHasNoDiskPressure"}},
          {{"type", "Ready"}, {"status", "True"}, {"lastHeartbeatTime", "@HB@"},
           {"reason", "KubeletReady"}, {"message", "kubelet is posting ready status"}}}},
        {"addresses", {{{"type", "InternalIP"}, {"address", "10.128.0.41"}}}},
        {"nodeInfo",
         {{"kubeletVersion", "v1.32.2-gke.1297002"},
          {"containerRuntimeVersion", "containerd://1.7.23"},
          {"kernelVersion", "6.1.112+"},
          {"osImage", "Container-Optimized OS from Google"},
          {"architecture", "amd64"},
          {"operatingSystem", "linux"}}}}}};
  return n.dump();
}

std::string PodTemplate() {
  nlohmann::json p = {
      {"kind", "Pod"},
      {"apiVersion", "v1"},
      {"metadata",
       {{"name", "@NAME@"},
        {"namespace", "ml-team-@NS@"},
        {"uid", "5f2a9c1e-1c3f-4e8a-b6d2-@UID@"},
        {"resourceVersion", "@RV@"},
        {"creationTimestamp", "2026-12-01T08:00:00Z"},
        {"generateName", "trainer-"},
        {"labels", {{"app", "trainer"}, {"job-name", "trainer"}, {"batch.kubernetes.io/job-completion-index", "3"}}},
        {"annotations", {{"duet.dev/devices", "gpu:0,1"}, {"duet.dev/placeholder-job", "123456"}}},
        {"ownerReferences",
         {{{"apiVersion", "batch/v1"}, {"kind", "Job"}, {"name", "trainer"},
           {"uid", "8c1e0f6a-2d7b-4c3e-9a51-0f2e3d4c5b6a"}, {"controller", true},
           {"blockOwnerDeletion", true}}}}}},
      {"spec",
       {{"schedulerName", "duet"},
        {"nodeName", "@NODE@"},
        {"restartPolicy", "Never"},
        {"serviceAccountName", "default"},
        {"containers",
         {{{"name", "main"},
           {"image", "nvcr.io/nvidia/pytorch:24.10-py3"},
           {"command", {"python", "train.py", "--epochs=10"}},
           {"resources",
            {{"limits", {{"nvidia.com/gpu", "2"}, {"memory", "64Gi"}}},
             {"requests", {{"nvidia.com/gpu", "2"}, {"cpu", "8"}, {"memory", "64Gi"}}}}},
           {"volumeMounts",
            {{{"name", "kube-api-access-x7kq2"},
              {"mountPath", "/var/run/secrets/kubernetes.io/serviceaccount"},
              {"readOnly", true}}}}}}},
        {"tolerations",
         {{{"key", "nvidia.com/gpu"}, {"operator", "Exists"}, {"effect", "NoSchedule"}},
          {{"key", "node.kubernetes.io/not-ready"}, {"operator", "Exists"}, {"effect", "NoExecute"},
           {"tolerationSeconds", 300}}}}}},
      {"status",
       {{"phase", "@PHASE@"},
        {"podIP", "10.64.3.17"},
        {"hostIP", "10.128.0.41"},
        {"qosClass", "Burstable"},
        {"startTime", "2026-12-01T08:00:02Z"},
        {"conditions",
         {{{"type", "Initialized"}, {"status", "True"}, {"lastTransitionTime", "2026-12-01T08:00:02Z"}},
          {{"type", "Ready"}, {"status", "True"}, {"lastTransitionTime", "2026-12-01T08:00:31Z"}},
          {{"type", "PodScheduled"}, {"status", "True"}, {"lastTransitionTime", "2026-12-01T08:00:01Z"}}}},
        {"containerStatuses",
         {{{"name", "main"}, {"ready", true}, {"restartCount", 0},
           {"image", "nvcr.io/nvidia/pytorch:24.10-py3"},
           {"imageID", "nvcr.io/nvidia/pytorch@sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f0"},
           {"containerID", "containerd://9a8b7c6d5e4f30211203f4e5d6c7b8a9"},
           {"state", {{"running", {{"startedAt", "2026-12-01T08:00:30Z"}}}}}}}}}}};
  return p.dump();
}

// Fills the @KEY@ holes of a template.
std::string Fill(const std::string& tmpl, const std::vector<std::pair<std::string, std::string>>& kv) {
  std::string out;
  out.reserve(tmpl.size() + 64);
  size_t i = 0;
  while (i < tmpl.size()) {
    size_t at = tmpl.find('@', i);
    if (at == std::string::npos) {
      out.append(tmpl, i, std::string::npos);
      break;
    }
    size_t end = tmpl.find('@', at + 1);
    out.append(tmpl, i, at - i);
    if (end == std::string::npos) {
      out.append(tmpl, at, std::string::npos);
      break;
    }
    const std::string key = tmpl.substr(at + 1, end - at - 1);
    bool done = false;
    for (const auto& [k, v] : kv) {
      if (k == key) {
        out += v;
        done = true;
        break;
      }
    }
    if (!done) {  // a literal '@' (an image digest)
      out += '@';
      i = at + 1;
      continue;
    }
    i = end + 1;
  }
  return out;
}

struct Resource {
  std::string tmpl;
  int count = 0;
  int events = 0;
  bool pods = false;
  std::string Object(int i, int64_t rv, int round) const {
    char uid[16];
    snprintf(uid, sizeof uid, "%012d", i);
    if (pods) {
      return Fill(tmpl, {{"NAME", absl::StrCat("trainer-", i)}, {"NS", std::to_string(i % 50)},
                         {"UID", uid}, {"RV", std::to_string(rv)},
                         {"NODE", absl::StrCat("gke-node-", i % 5000)},
                         {"PHASE", round % 2 ? "Running" : "Pending"}});
    }
    return Fill(tmpl, {{"NAME", absl::StrCat("gke-node-", i)}, {"UID", uid}, {"RV", std::to_string(rv)},
                       {"HB", absl::StrCat("2026-12-02T10:", 10 + round % 50, ":00Z")}});
  }
};

constexpr int64_t kListRv = 1000;

class Server {
 public:
  Server(Resource nodes, Resource pods) : nodes_(std::move(nodes)), pods_(std::move(pods)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    listen(fd_, 16);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    accept_ = std::thread([this] { Accept(); });
  }
  ~Server() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    accept_.join();
    std::lock_guard<std::mutex> l(mu_);
    for (int c : conns_) shutdown(c, SHUT_RDWR);
    for (std::thread& t : threads_) t.join();
  }
  int port() const { return port_; }

 private:
  void Accept() {
    while (!stop_) {
      int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::lock_guard<std::mutex> l(mu_);
      conns_.push_back(c);
      threads_.emplace_back([this, c] { Serve(c); });
    }
  }

  static bool WriteAll(int c, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = send(c, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += n;
    }
    return true;
  }

  void Serve(int c) {
    std::string req;
    char buf[4096];
    while (!stop_) {
      size_t end;
      while ((end = req.find("\r\n\r\n")) == std::string::npos) {
        ssize_t n = recv(c, buf, sizeof buf, 0);
        if (n <= 0) {
          close(c);
          return;
        }
        req.append(buf, n);
      }
      const std::string line = req.substr(0, req.find("\r\n"));
      req.erase(0, end + 4);
      const std::string path = line.substr(line.find(' ') + 1, line.rfind(' ') - line.find(' ') - 1);
      const Resource& r = path.rfind("/api/v1/pods", 0) == 0 ? pods_ : nodes_;
      if (path.find("watch=1") != std::string::npos) {
        Watch(c, r, path);
        close(c);
        return;
      }
      List(c, r, path);
    }
    close(c);
  }

  void List(int c, const Resource& r, const std::string& path) {
    int limit = 500;
    int page = 0;
    if (size_t p = path.find("continue="); p != std::string::npos) page = std::atoi(path.c_str() + p + 9);
    const int first = page * limit;
    const int last = std::min(r.count, first + limit);
    std::string body = absl::StrCat(R"({"kind":")", r.pods ? "PodList" : "NodeList",
                                    R"(","apiVersion":"v1","metadata":{"resourceVersion":")", kListRv, "\"");
    if (last < r.count) absl::StrAppend(&body, R"(,"continue":")", page + 1, "\"");
    body += R"(},"items":[)";
    for (int i = first; i < last; ++i) {
      if (i > first) body += ',';
      body += r.Object(i, 1 + i, 0);
    }
    body += "]}";
    WriteAll(c, absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ",
                             body.size(), "\r\n\r\n", body));
  }

  void Watch(int c, const Resource& r, const std::string& path) {
    const bool first = path.find(absl::StrCat("resourceVersion=", kListRv, "&")) != std::string::npos;
    WriteAll(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
    if (!first) {  // a resumed watch: idle until shutdown
      while (!stop_) {
        if (recv(c, buf_dummy_, 1, 0) <= 0) return;
      }
      return;
    }
    std::string chunk;
    int64_t rv = kListRv;
    for (int e = 0; e < r.events && !stop_; ++e) {
      const int i = e % r.count;
      chunk += R"({"type":"MODIFIED","object":)";
      chunk += r.Object(i, ++rv, 1 + e / r.count);
      chunk += "}\n";
      if (chunk.size() > (256 << 10) || e + 1 == r.events) {
        char head[32];
        snprintf(head, sizeof head, "%zx\r\n", chunk.size());
        if (!WriteAll(c, head + chunk + "\r\n")) return;
        chunk.clear();
      }
    }
    WriteAll(c, "0\r\n\r\n");
  }

  Resource nodes_, pods_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread accept_;
  std::mutex mu_;
  std::vector<int> conns_;
  std::vector<std::thread> threads_;
  char buf_dummy_[1];
};

// What the bridge would keep per pod: identity, node, phase, GPU request.
class PodTable : public InformerHandler {
 public:
  struct Pod {
    std::string uid;
    std::string node;
    std::string phase;
    int gpus = 0;
  };
  void OnUpsert(const nlohmann::json& o) override {
    const auto& md = o["metadata"];
    Pod& p = pods_[absl::StrCat(md["namespace"].get_ref<const std::string&>(), "/",
                                md["name"].get_ref<const std::string&>())];
    p.uid = md["uid"].get<std::string>();
    p.node = o["spec"].value("nodeName", "");
    p.phase = o["status"].value("phase", "");
    int g = 0;
    for (const auto& c : o["spec"]["containers"]) {
      auto lim = c["resources"]["limits"].find("nvidia.com/gpu");
      if (lim != c["resources"]["limits"].end()) g += std::atoi(lim->get_ref<const std::string&>().c_str());
    }
    p.gpus = g;
    ++applied;
  }
  void OnDelete(const std::string& key, const nlohmann::json*) override {
    pods_.erase(key);
    ++applied;
  }
  void OnSynced() override {}
  std::atomic<int64_t> applied{0};

 private:
  std::map<std::string, Pod> pods_;
};

class CountingSink : public InventorySink {
 public:
  void ReplaceAll(const std::vector<NodeSpec>& nodes) override { replaced = nodes.size(); }
  void Upsert(const NodeSpec&) override { ++upserts; }
  void Remove(const std::string&) override {}
  std::atomic<size_t> replaced{0};
  std::atomic<int64_t> upserts{0};
};

int Main(int argc, char** argv) {
  int nodes = 5000, pods = 50000, node_events = 20000, pod_events = 200000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string f = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (f == "--nodes") nodes = v;
    if (f == "--pods") pods = v;
    if (f == "--node-events") node_events = v;
    if (f == "--pod-events") pod_events = v;
  }
  spdlog::set_level(spdlog::level::warn);
  Resource rn{NodeTemplate(), nodes, node_events, false};
  Resource rp{PodTemplate(), pods, pod_events, true};
  const size_t node_bytes = rn.Object(0, 1, 0).size();
  const size_t pod_bytes = rp.Object(0, 1, 0).size();
  Server server(rn, rp);
  KubeConfig c;
  c.server = absl::StrCat("http://127.0.0.1:", server.port());
  auto client = NewCurlKubeClient(c);
  if (!client.ok()) return 1;

  const int64_t rss0 = Kib("VmRSS:");
  // Nodes: the inventory source, as the bridge runs it.
  NodeInventoryOptions no;
  no.label_selector = "duet.dev/shared=true";
  KubeNodeInventory inv(client->get(), no);
  CountingSink sink;
  absl::Time t = absl::Now();
  if (!inv.Start(&sink).ok()) return 1;
  const double node_list_s = absl::ToDoubleSeconds(absl::Now() - t);
  t = absl::Now();
  while (inv.stats().events < static_cast<uint64_t>(node_events)) absl::SleepFor(absl::Milliseconds(1));
  const double node_watch_s = absl::ToDoubleSeconds(absl::Now() - t);
  const int64_t rss_nodes = Kib("VmRSS:");

  PodTable table;
  InformerOptions po;
  po.path = "/api/v1/pods";
  Informer informer(client->get(), po, &table);
  t = absl::Now();
  if (!informer.Start().ok()) return 1;
  const double pod_list_s = absl::ToDoubleSeconds(absl::Now() - t);
  const int64_t rss_pod_list = Kib("VmRSS:");
  t = absl::Now();
  while (informer.stats().events < static_cast<uint64_t>(pod_events)) absl::SleepFor(absl::Milliseconds(1));
  const double pod_watch_s = absl::ToDoubleSeconds(absl::Now() - t);
  const int64_t rss_end = Kib("VmRSS:");

  nlohmann::json out = {
      {"nodes", nodes},
      {"pods", pods},
      {"node_object_bytes", node_bytes},
      {"pod_object_bytes", pod_bytes},
      {"node_list_s", node_list_s},
      {"node_list_objects_per_s", nodes / node_list_s},
      {"node_watch_events", node_events},
      {"node_watch_events_per_s", node_events / node_watch_s},
      {"node_upserts_delivered", sink.upserts.load()},
      {"pod_list_s", pod_list_s},
      {"pod_list_objects_per_s", pods / pod_list_s},
      {"pod_watch_events", pod_events},
      {"pod_watch_events_per_s", pod_events / pod_watch_s},
      {"pod_watch_MB_per_s", pod_events * static_cast<double>(pod_bytes) / pod_watch_s / 1e6},
      {"rss_start_mib", rss0 / 1024.0},
      {"rss_after_nodes_mib", rss_nodes / 1024.0},
      {"rss_after_pod_list_mib", rss_pod_list / 1024.0},
      {"rss_end_mib", rss_end / 1024.0},
      {"rss_peak_mib", Kib("VmHWM:") / 1024.0}};
  printf("%s\n", out.dump(2).c_str());
  informer.Stop();
  inv.Stop();
  return sink.replaced == static_cast<size_t>(nodes) && table.applied >= pods + pod_events ? 0 : 2;
}

}  // namespace
}  // namespace k8s
}  // namespace duet

int main(int argc, char** argv) { return duet::k8s::Main(argc, argv); }
