#include "duetctl/cli.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <set>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "duetctl/client.h"
#include "duetctl/render.h"

#ifndef DUET_VERSION
#define DUET_VERSION "unknown"
#endif

namespace duet::ctl {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_watching{false};
static_assert(std::atomic<bool>::is_always_lock_free, "RequestStop must be signal-safe");

// Events that arrive within this long of each other are drawn as one update,
// so the burst of INITIAL events at the start of a watch is not N tables.
constexpr absl::Duration kQuiet = absl::Milliseconds(50);
// ...but a steady stream of events still redraws at least this often.
constexpr absl::Duration kMaxDelay = absl::Milliseconds(500);
constexpr absl::Duration kPoll = absl::Milliseconds(200);

struct Flags {
  ClientOptions client;
  std::string timeout = "5s";
  std::vector<std::string> names;
  std::string node;
  bool json = false;
  bool watch = false;
};

// Messages quote server answers and names from the cluster: printed through
// Printable, so one message is one visible line.
int Fail(const CliEnv& env, int code, const std::string& message) {
  *env.err << "duetctl: " << Printable(message) << "\n";
  return code;
}

int FailStatus(const CliEnv& env, const absl::Status& status) {
  return Fail(env, kExitRpcError, std::string(status.message()));
}

// "5s", "500ms", "1m30s", or a plain number of seconds.
bool ParseTimeout(const std::string& text, absl::Duration* out) {
  std::string t(absl::StripAsciiWhitespace(text));
  double seconds;
  if (absl::SimpleAtod(t, &seconds)) {
    *out = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(t, out)) {
    return false;
  }
  return *out > absl::ZeroDuration() && *out != absl::InfiniteDuration();
}

// Bytes that are not UTF-8 print as U+FFFD instead of making dump() throw:
// valid JSON whatever the strings hold (controls nlohmann escapes itself).
std::string DumpJson(const Json& j, int indent) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

void PrintJson(const CliEnv& env, const Json& j) { *env.out << DumpJson(j, 2) << "\n"; }

// Nodes asked for by name that the server did not return.
std::vector<std::string> MissingNames(const std::vector<std::string>& names,
                                      const v1::ListNodesResponse& response) {
  std::set<std::string> found;
  for (const v1::Node& n : response.nodes()) found.insert(n.name());
  std::vector<std::string> missing;
  for (const auto& n : names) {
    if (found.count(n) == 0) missing.push_back(n);
  }
  return missing;
}

int NodesOnce(Client& client, const Flags& flags, const CliEnv& env) {
  auto response = client.ListNodes(flags.names);
  if (!response.ok()) return FailStatus(env, response.status());
  const std::vector<std::string> missing = MissingNames(flags.names, *response);
  if (flags.json) {
    PrintJson(env, NodesJson(*response));
  } else if (!response->nodes().empty() || missing.empty()) {
    *env.out << RenderNodesTable(*response);
  }
  for (const auto& name : missing) {
    Fail(env, kExitRpcError, absl::StrCat("no node named ", name, " (duetctl nodes lists them)"));
  }
  return missing.empty() ? kExitOk : kExitRpcError;
}

class WatchScreen {
 public:
  WatchScreen(const Flags& flags, const CliEnv& env) : flags_(flags), env_(env) {}

  void Replace(const v1::ListNodesResponse& response) {
    nodes_.clear();
    for (const v1::Node& n : response.nodes()) nodes_[n.name()] = n;
  }

  // Returns whether the screen must be redrawn.
  bool Apply(const v1::NodeEvent& event) {
    const std::string& name = event.node().name();
    switch (event.type()) {
      case v1::NodeEvent::TYPE_INITIAL: {
        auto it = nodes_.find(name);
        if (it != nodes_.end() && it->second.generation() == event.node().generation()) {
          return false;  // Already drawn from ListNodes.
        }
        nodes_[name] = event.node();
        return true;
      }
      case v1::NodeEvent::TYPE_UPDATED:
        nodes_[name] = event.node();
        return true;
      case v1::NodeEvent::TYPE_REMOVED:
        nodes_.erase(name);
        return true;
      default:
        return false;
    }
  }

  // False when stdout is gone (e.g. `duetctl nodes --watch | head`).
  bool Draw() {
    v1::ListNodesResponse response;
    for (const auto& [name, node] : nodes_) *response.add_nodes() = node;
    std::ostream& out = *env_.out;
    if (flags_.json) {
      out << DumpJson(NodesJson(response), -1) << "\n";  // JSON Lines: one document per update
    } else if (env_.out_is_tty) {
      out << "\033[H\033[2J" << "duet-bridge at " << Printable(flags_.client.server) << ", "
          << absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone())
          << " (Ctrl-C to stop)\n\n"
          << RenderNodesTable(response);
    } else {
      if (draws_ > 0) out << "\n";
      out << RenderNodesTable(response);
    }
    out.flush();
    ++draws_;
    return static_cast<bool>(out);
  }

 private:
  const Flags& flags_;
  const CliEnv& env_;
  std::map<std::string, v1::Node> nodes_;
  int draws_ = 0;
};

int NodesWatch(Client& client, const Flags& flags, const CliEnv& env) {
  // A first answer within --timeout (the stream itself has no deadline), and
  // a full table to start from.
  auto first = client.ListNodes(flags.names);
  if (!first.ok()) return FailStatus(env, first.status());
  const std::vector<std::string> missing = MissingNames(flags.names, *first);
  if (!missing.empty()) {
    for (const auto& name : missing) {
      Fail(env, kExitRpcError, absl::StrCat("no node named ", name, " (duetctl nodes lists them)"));
    }
    return kExitRpcError;
  }
  WatchScreen screen(flags, env);
  screen.Replace(*first);
  if (!screen.Draw()) return kExitOk;

  std::unique_ptr<NodeWatch> watch = client.WatchNodes(flags.names);
  g_watching.store(true);
  struct Unmark {
    ~Unmark() { g_watching.store(false); }
  } unmark;
  bool dirty = false;
  bool cancelled = false;
  absl::Time dirty_since;
  for (;;) {
    if (!cancelled && g_stop.load()) {
      watch->Cancel();
      cancelled = true;
    }
    v1::NodeEvent event;
    const NodeWatch::Result r = watch->Next(dirty ? kQuiet : kPoll, &event);
    if (r == NodeWatch::Result::kEvent) {
      bool changed = screen.Apply(event);
      if (event.type() == v1::NodeEvent::TYPE_RESYNC) {
        // Events were skipped (a REMOVED among them, perhaps): start again
        // from a full list.
        auto again = client.ListNodes(flags.names);
        if (again.ok()) {
          screen.Replace(*again);
          changed = true;
        }
      }
      if (changed && !dirty) {
        dirty = true;
        dirty_since = absl::Now();
      }
      if (!dirty || absl::Now() - dirty_since < kMaxDelay) continue;
    } else if (r == NodeWatch::Result::kTimeout && !dirty) {
      continue;
    }
    if (dirty) {
      dirty = false;
      if (!screen.Draw() && !cancelled) {
        watch->Cancel();
        cancelled = true;
      }
    }
    if (r != NodeWatch::Result::kDone) continue;
    const absl::Status status = watch->status();
    if (!status.ok()) return FailStatus(env, status);
    if (!cancelled) *env.err << "duetctl: duet-bridge ended the watch\n";
    return kExitOk;
  }
}

int Holds(Client& client, const Flags& flags, const CliEnv& env) {
  auto response = client.ListHoldings(flags.node);
  if (!response.ok()) return FailStatus(env, response.status());
  if (!flags.node.empty() && response->holdings().empty()) {
    // Empty because the node has no holdings, or because there is no such
    // node? Only the second is an error.
    auto node = client.GetNode(flags.node);
    if (!node.ok()) return FailStatus(env, node.status());
  }
  if (flags.json) {
    PrintJson(env, HoldsJson(*response));
  } else if (response->holdings().empty() && !flags.node.empty()) {
    *env.out << "No holdings on node " << Printable(flags.node) << ".\n";
  } else {
    *env.out << RenderHoldsTable(*response, absl::Now());
  }
  return kExitOk;
}

int NodeDetail(Client& client, const Flags& flags, const CliEnv& env) {
  auto node = client.GetNode(flags.node);
  if (!node.ok()) return FailStatus(env, node.status());
  if (flags.json) {
    PrintJson(env, NodeJson(*node));
  } else {
    *env.out << RenderNodeDetail(*node);
  }
  return kExitOk;
}

}  // namespace

bool RequestStop() {
  g_stop.store(true);
  return g_watching.load();
}
void ResetStop() { g_stop.store(false); }

int RunCli(const std::vector<std::string>& args, const CliEnv& env) {
  Flags flags;
  flags.client.server = env.server_env.empty() ? kDefaultServer : env.server_env;

  CLI::App app("duetctl: who holds which GPU/TPU on which node (Slurm jobs vs Kubernetes pods).",
               "duetctl");
  app.fallthrough();  // global flags may follow the subcommand
  app.require_subcommand(1);
  app.add_option("--server", flags.client.server,
                 "duet-bridge address: unix:///path or host:port (env DUET_SERVER)")
      ->capture_default_str();
  app.add_option("--timeout", flags.timeout, "deadline per call, e.g. 5s, 500ms")
      ->capture_default_str();
  app.add_option("--ca-file", flags.client.ca_file, "use TLS, trusting these CA certificates");
  app.add_option("--cert-file", flags.client.cert_file, "TLS client certificate (PEM)");
  app.add_option("--key-file", flags.client.key_file, "TLS client key (PEM)");

  CLI::App* nodes = app.add_subcommand("nodes", "devices per node: total, held by Slurm, by pods, free");
  nodes->add_option("names", flags.names, "only these nodes");
  nodes->add_flag("--json", flags.json, "print JSON");
  nodes->add_flag("-w,--watch", flags.watch, "redraw on every change until Ctrl-C");

  CLI::App* holds = app.add_subcommand("holds", "who holds which devices, and since when");
  holds->add_option("--node", flags.node, "only this node");
  holds->add_flag("--json", flags.json, "print JSON");

  CLI::App* node = app.add_subcommand("node", "one node in detail: every device and its holders");
  node->add_option("name", flags.node, "node name")->required();
  node->add_flag("--json", flags.json, "print JSON");

  CLI::App* workload = app.add_subcommand(
      "workload", "the pod/job shapes placement scores against, as duet-bridge learned them");
  workload->add_flag("--json", flags.json, "print JSON");

  CLI::App* version = app.add_subcommand("version", "print duetctl's version");

  std::vector<const char*> argv = {"duetctl"};
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::RequiredError& e) {
    // `duetctl nodez` parses as "no subcommand"; name the word instead.
    if (app.get_subcommands().empty() && !args.empty() && args[0].rfind('-', 0) != 0) {
      return Fail(env, kExitUsage,
                  absl::StrCat("unknown command \"", args[0], "\" (duetctl --help lists them)"));
    }
    return app.exit(e, *env.out, *env.err) == 0 ? kExitOk : kExitUsage;
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e, *env.out, *env.err);
    return rc == 0 ? kExitOk : kExitUsage;
  }

  if (version->parsed()) {
    *env.out << "duetctl " << DUET_VERSION << " (API duet.v1)\n";
    return kExitOk;
  }
  if (!ParseTimeout(flags.timeout, &flags.client.timeout)) {
    return Fail(env, kExitUsage,
                absl::StrCat("--timeout: \"", flags.timeout,
                             "\" is not a positive duration (e.g. 5s, 500ms, 1m)"));
  }
  auto channel = MakeChannel(flags.client);
  if (!channel.ok()) return Fail(env, kExitUsage, std::string(channel.status().message()));
  Client client(*std::move(channel), flags.client);

  if (nodes->parsed()) {
    return flags.watch ? NodesWatch(client, flags, env) : NodesOnce(client, flags, env);
  }
  if (holds->parsed()) return Holds(client, flags, env);
  if (node->parsed()) return NodeDetail(client, flags, env);
  if (workload->parsed()) {
    auto response = client.GetWorkload();
    if (!response.ok()) return FailStatus(env, response.status());
    if (flags.json) {
      PrintJson(env, WorkloadJson(*response));
    } else {
      *env.out << RenderWorkloadTable(*response);
    }
    return kExitOk;
  }
  return Fail(env, kExitUsage, "no command given (duetctl --help lists them)");
}

}  // namespace duet::ctl
