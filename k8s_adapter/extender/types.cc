#include "k8s_adapter/extender/types.h"

#include <algorithm>
#include <charconv>
#include <cstring>

#include "absl/functional/function_ref.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "k8s_adapter/common/pod_request.h"
#include "simdjson.h"

namespace duet {
namespace extender {
namespace {

using nlohmann::json;

// The member of `obj` whose key equals `key` ignoring ASCII case (Go's
// decoder rule); the exact key is tried first. Null when absent.
const json* Member(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it != obj.end()) return &*it;
  for (auto i = obj.begin(); i != obj.end(); ++i) {
    if (absl::EqualsIgnoreCase(i.key(), key)) return &*i;
  }
  return nullptr;
}

// A string member; "" when absent or null. INVALID_ARGUMENT when another type.
absl::StatusOr<std::string> StringMember(const json& obj, const char* key, const std::string& where) {
  const json* v = Member(obj, key);
  if (v == nullptr || v->is_null()) return std::string();
  if (!v->is_string()) return absl::InvalidArgumentError(absl::StrCat(where, ".", key, ": not a string"));
  return v->get<std::string>();
}

const json* Path(const json& obj, std::initializer_list<const char*> keys) {
  const json* cur = &obj;
  for (const char* k : keys) {
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(k);
    if (it == cur->end()) return nullptr;
    cur = &*it;
  }
  return cur;
}

absl::StatusOr<uint32_t> WholeDevices(int64_t milli, const char* resource) {
  if (milli % 1000 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(resource, ": must be a whole number of devices"));
  }
  if (milli / 1000 > 1024) return absl::InvalidArgumentError(absl::StrCat(resource, ": more than 1024 devices"));
  return static_cast<uint32_t>(milli / 1000);
}

absl::StatusOr<placement::PodRequest> ParsePodRequestOrThrow(const json& pod) {
  absl::StatusOr<k8s::ResourceList> effective = k8s::EffectivePodRequest(pod);
  if (!effective.ok()) return effective.status();
  const int64_t gpu = k8s::Amount(*effective, kGpuResource);
  const int64_t tpu = k8s::Amount(*effective, kTpuResource);
  const json& spec = *k8s::Field(pod, "spec");  // an object: EffectivePodRequest checked

  placement::PodRequest req;
  if (gpu > 0 && tpu > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pod asks for both ", kGpuResource, " and ", kTpuResource, "; duet places one device kind per pod"));
  }
  const char* selector = kGpuModelSelector;
  if (tpu > 0) {
    req.kind = DeviceKind::kTpu;
    absl::StatusOr<uint32_t> n = WholeDevices(tpu, kTpuResource);
    if (!n.ok()) return n.status();
    req.count = *n;
    selector = kTpuModelSelector;
  } else {
    absl::StatusOr<uint32_t> n = WholeDevices(gpu, kGpuResource);
    if (!n.ok()) return n.status();
    req.count = *n;
  }
  req.cpu_milli = static_cast<uint64_t>(k8s::Amount(*effective, "cpu"));
  // milli-bytes -> MiB, rounded up.
  constexpr int64_t kMilliMiB = int64_t{1000} << 20;
  const int64_t mem = k8s::Amount(*effective, "memory");
  req.memory_mib = static_cast<uint64_t>(mem / kMilliMiB + (mem % kMilliMiB != 0 ? 1 : 0));

  const json* annotations = Path(pod, {"metadata", "annotations"});
  const json* models = annotations != nullptr ? Path(*annotations, {kModelsAnnotation}) : nullptr;
  if (models != nullptr && models->is_string()) {
    for (absl::string_view m : absl::StrSplit(models->get<std::string>(), ',', absl::SkipWhitespace())) {
      req.models.emplace_back(absl::StripAsciiWhitespace(m));
    }
  } else {
    const json* sel = Path(spec, {"nodeSelector", selector});
    if (sel != nullptr && sel->is_string() && !sel->get<std::string>().empty()) {
      req.models.push_back(sel->get<std::string>());
    }
  }
  const json* milli = annotations != nullptr ? Path(*annotations, {kDeviceMilliAnnotation}) : nullptr;
  if (milli != nullptr && req.count > 0) {
    uint32_t m = 0;
    if (!milli->is_string() || !absl::SimpleAtoi(milli->get<std::string>(), &m) || m == 0 ||
        m > kWholeDevice) {
      return absl::InvalidArgumentError(absl::StrCat("metadata.annotations[", kDeviceMilliAnnotation,
                                                     "]: must be an integer in 1..1000"));
    }
    req.milli = m;
  }
  if (req.count > 0) {
    absl::Status v = placement::ValidatePodRequest(req);
    if (!v.ok()) return v;
  }
  return req;
}

json* MutableMember(json& obj, const char* key) {
  return const_cast<json*>(Member(obj, key));
}

// Counts nesting and keeps nothing. Returning false stops sax_parse at once:
// at the first level too deep, and at a syntax error (left to the real parse
// to word).
class DepthSax final : public nlohmann::json_sax<json> {
 public:
  explicit DepthSax(int max_depth) : max_(max_depth) {}
  bool too_deep() const { return too_deep_; }

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return Descend(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return Ascend(); }
  bool start_array(std::size_t) override { return Descend(); }
  bool end_array() override { return Ascend(); }
  bool parse_error(std::size_t, const std::string&, const json::exception&) override {
    return false;
  }

 private:
  bool Descend() {
    if (++depth_ > max_) too_deep_ = true;
    return !too_deep_;
  }
  bool Ascend() {
    --depth_;
    return true;
  }

  const int max_;
  int depth_ = 0;
  bool too_deep_ = false;
};

}  // namespace

absl::Status CheckJsonDepth(std::string_view text, int max_depth) {
  DepthSax sax(max_depth);
  json::sax_parse(text.begin(), text.end(), &sax);
  if (sax.too_deep()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the body nests JSON objects and arrays deeper than ", max_depth,
        " levels (the extender's limit)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ExtenderArgs> ParseExtenderArgs(json body) {
  if (!body.is_object()) return absl::InvalidArgumentError("ExtenderArgs: the body must be a JSON object");
  ExtenderArgs args;
  json* pod = MutableMember(body, "Pod");
  if (pod == nullptr || pod->is_null()) return absl::InvalidArgumentError("ExtenderArgs.Pod: missing");
  if (!pod->is_object()) return absl::InvalidArgumentError("ExtenderArgs.Pod: not an object");
  args.pod = std::move(*pod);
  json* names = MutableMember(body, "NodeNames");
  const json* nodes = Member(body, "Nodes");
  if (names != nullptr && !names->is_null()) {
    if (!names->is_array()) return absl::InvalidArgumentError("ExtenderArgs.NodeNames: not a list");
    if (names->size() > kMaxNodesPerRequest) {
      return absl::InvalidArgumentError(
          absl::StrCat("ExtenderArgs.NodeNames: more than ", kMaxNodesPerRequest, " names"));
    }
    args.node_names.reserve(names->size());
    for (size_t i = 0; i < names->size(); ++i) {
      json& n = (*names)[i];
      if (!n.is_string()) {
        return absl::InvalidArgumentError(absl::StrCat("ExtenderArgs.NodeNames[", i, "]: not a string"));
      }
      args.node_names.push_back(std::move(n.get_ref<std::string&>()));
    }
  } else if (nodes != nullptr && !nodes->is_null()) {
    const json* items = Path(*nodes, {"items"});
    if (items == nullptr || !items->is_array()) {
      return absl::InvalidArgumentError("ExtenderArgs.Nodes.items: missing or not a list");
    }
    if (items->size() > kMaxNodesPerRequest) {
      return absl::InvalidArgumentError(
          absl::StrCat("ExtenderArgs.Nodes.items: more than ", kMaxNodesPerRequest, " nodes"));
    }
    for (size_t i = 0; i < items->size(); ++i) {
      const json* name = Path((*items)[i], {"metadata", "name"});
      if (name == nullptr || !name->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("ExtenderArgs.Nodes.items[", i, "].metadata.name: missing or not a string"));
      }
      args.node_names.push_back(name->get<std::string>());
    }
    args.from_node_list = true;
    args.node_list = *nodes;
  } else {
    return absl::InvalidArgumentError("ExtenderArgs: neither NodeNames nor Nodes is set");
  }
  return args;
}

namespace {

// The fast paths' reading of a body (see ParseExtenderArgsFast): `pod_text`
// gets the pod's text as sent (not checked beyond simdjson's structure),
// `add_name` each name in order (false: stop, too many). False for any body
// the fast path does not take.
bool ReadFastBody(const std::string& body, std::string* pod_text,
                  absl::FunctionRef<bool(std::string_view)> add_name) {
  namespace od = simdjson::ondemand;
  // simdjson reads a few bytes past the end: give it a padded copy (a
  // memcpy, small beside parsing).
  const simdjson::padded_string padded(body);
  thread_local od::parser parser;  // reused buffers; one per server thread
  bool have_pod = false, have_names = false, have_nodes = false;
  try {
    od::document doc = parser.iterate(padded);
    // On-Demand does not look past the top-level value (simdjson 3.0 has no
    // document::at_end): only JSON whitespace may follow its closing brace.
    od::object whole_object = doc.get_object();
    const std::string_view whole = whole_object.raw_json();
    const size_t end = static_cast<size_t>(whole.data() - padded.data()) + whole.size();
    if (body.find_first_not_of(" \t\r\n", end) != std::string::npos) return false;
    doc.rewind();
    od::object top = doc.get_object();
    for (od::field field : top) {
      const std::string_view key = field.unescaped_key();
      if (key == "Pod" && !have_pod) {
        have_pod = true;
        od::object pod = field.value().get_object();
        const std::string_view raw = pod.raw_json();
        pod_text->assign(raw);
      } else if (key == "NodeNames" && !have_names) {
        have_names = true;
        od::array names = field.value().get_array();
        for (auto name : names) {
          if (!add_name(name.get_string())) return false;
        }
      } else if (key == "Nodes" && !have_nodes) {
        have_nodes = true;
        if (!field.value().is_null()) return false;
      } else {
        // Another key, a key again, or one Go would match ignoring case:
        // the general path decides.
        return false;
      }
    }
  } catch (const simdjson::simdjson_error&) {
    return false;
  }
  return have_pod && have_names;
}

}  // namespace

std::optional<json> ParsePodText(std::string_view pod_text) {
  // Too deep: the general path refuses it (before any DOM). The pod is one
  // level below the body's top.
  if (!CheckJsonDepth(pod_text, kMaxJsonDepth - 1).ok()) return std::nullopt;
  // The pod is small (a few KB): nlohmann's DOM, as the general path.
  json pod = json::parse(pod_text.begin(), pod_text.end(), nullptr, /*allow_exceptions=*/false);
  if (!pod.is_object()) return std::nullopt;  // also: discarded (invalid)
  return pod;
}

std::optional<ExtenderArgs> ParseExtenderArgsFast(const std::string& body) {
  ExtenderArgs args;
  const bool ok = ReadFastBody(body, &args.pod_text, [&args](std::string_view n) {
    args.node_names.emplace_back(n);
    return args.node_names.size() <= kMaxNodesPerRequest;
  });
  if (!ok) return std::nullopt;
  std::optional<json> pod = ParsePodText(args.pod_text);
  if (!pod.has_value()) return std::nullopt;
  args.pod = std::move(*pod);
  return args;
}

std::optional<PrioritizeArgs> ParsePrioritizeArgsFast(const std::string& body) {
  PrioritizeArgs args;
  // The names, unescaped, take no more than the body's bytes.
  // Not zeroed: every byte a view covers is written first.
  args.name_block.reset(new char[body.size() + 1]);
  char* const block = args.name_block.get();
  size_t used = 0;
  const bool ok = ReadFastBody(body, &args.pod_text, [&](std::string_view n) {
    if (used + n.size() > body.size()) return false;  // cannot happen; never overrun
    if (!n.empty()) std::memcpy(block + used, n.data(), n.size());
    args.node_names.emplace_back(block + used, n.size());
    used += n.size();
    return args.node_names.size() <= kMaxNodesPerRequest;
  });
  if (!ok) return std::nullopt;
  return args;
}

absl::StatusOr<BindingArgs> ParseBindingArgs(const json& body) {
  if (!body.is_object()) {
    return absl::InvalidArgumentError("ExtenderBindingArgs: the body must be a JSON object");
  }
  const std::string where = "ExtenderBindingArgs";
  BindingArgs a;
  std::pair<const char*, std::string*> fields[] = {{"PodName", &a.pod_name},
                                                   {"PodNamespace", &a.pod_namespace},
                                                   {"PodUID", &a.pod_uid},
                                                   {"Node", &a.node}};
  for (auto& [key, out] : fields) {
    absl::StatusOr<std::string> v = StringMember(body, key, where);
    if (!v.ok()) return v.status();
    *out = std::move(*v);
  }
  if (a.pod_name.empty()) return absl::InvalidArgumentError("ExtenderBindingArgs.PodName: must be set");
  if (a.node.empty()) return absl::InvalidArgumentError("ExtenderBindingArgs.Node: must be set");
  if (a.pod_namespace.empty()) a.pod_namespace = "default";
  for (auto& [key, out] : fields) {
    if (out->size() > 253) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".", key, ": longer than 253 characters"));
    }
    // Names go into API paths: DNS subdomain characters only (UIDs too).
    for (char ch : *out) {
      if (!(absl::ascii_isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '.')) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".", key, ": \"", *out, "\" has a character other than [a-z0-9.-]"));
      }
    }
  }
  return a;
}

json FilterResultJson(const FilterResult& r, const ExtenderArgs* args) {
  json out = json::object();
  if (args != nullptr && args->from_node_list) {
    // Keep the passing nodes' objects, in the request's order.
    json list = args->node_list;
    json kept = json::array();
    size_t next = 0;
    const json& items = list["items"];
    for (const json& item : items) {
      if (next < r.node_names.size() && item["metadata"]["name"] == r.node_names[next]) {
        kept.push_back(item);
        ++next;
      }
    }
    list["items"] = std::move(kept);
    out["Nodes"] = std::move(list);
    out["NodeNames"] = nullptr;
  } else {
    out["Nodes"] = nullptr;
    out["NodeNames"] = r.node_names;
  }
  out["FailedNodes"] = r.failed;
  out["FailedAndUnresolvableNodes"] = r.failed_unresolvable;
  out["Error"] = r.error;
  return out;
}

json PriorityListJson(const std::vector<HostPriority>& list) {
  json out = json::array();
  for (const HostPriority& h : list) out.push_back({{"Host", h.host}, {"Score", h.score}});
  return out;
}

json BindingResultJson(const std::string& error) { return {{"Error", error}}; }

namespace {

// The dump options the server uses (server.cc, Json()).
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// One JSON string. Printable ASCII other than '"' and '\\' (every node name,
// every reason duet writes) needs no escape, and nlohmann writes it as is;
// anything else is escaped by nlohmann itself (no escaping of our own).
void AppendString(const std::string& s, std::string* out) {
  const bool plain = std::all_of(s.begin(), s.end(), [](char c) {
    return c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
  });
  if (!plain) {
    out->append(Dump(json(s)));
    return;
  }
  out->push_back('"');
  out->append(s);
  out->push_back('"');
}

// {"k":"v",...} from a sorted map: the order nlohmann's object keeps too.
void AppendStringMap(const std::map<std::string, std::string>& m, std::string* out) {
  out->push_back('{');
  bool first = true;
  for (const auto& [k, v] : m) {
    if (!first) out->push_back(',');
    first = false;
    AppendString(k, out);
    out->push_back(':');
    AppendString(v, out);
  }
  out->push_back('}');
}

}  // namespace

std::string FilterResultBody(const FilterResult& r, const ExtenderArgs* args) {
  if (args != nullptr && args->from_node_list) return Dump(FilterResultJson(r, args));
  std::string out;
  out.reserve(64 + 32 * (r.node_names.size() + 3 * (r.failed.size() + r.failed_unresolvable.size())));
  // Keys in nlohmann's (sorted) order.
  out.append("{\"Error\":");
  AppendString(r.error, &out);
  out.append(",\"FailedAndUnresolvableNodes\":");
  AppendStringMap(r.failed_unresolvable, &out);
  out.append(",\"FailedNodes\":");
  AppendStringMap(r.failed, &out);
  out.append(",\"NodeNames\":[");
  for (size_t i = 0; i < r.node_names.size(); ++i) {
    if (i > 0) out.push_back(',');
    AppendString(r.node_names[i], &out);
  }
  out.append("],\"Nodes\":null}");
  return out;
}

std::string PriorityListBody(const std::vector<HostPriority>& list) {
  std::string out;
  out.reserve(2 + 40 * list.size());
  out.push_back('[');
  for (size_t i = 0; i < list.size(); ++i) {
    if (i > 0) out.push_back(',');
    out.append("{\"Host\":");
    AppendString(list[i].host, &out);
    absl::StrAppend(&out, ",\"Score\":", list[i].score, "}");
  }
  out.push_back(']');
  return out;
}

namespace {

// PriorityListBody's entries for names that need no escape (every name a
// node can have), written into a buffer sized once; `hosts` and `scores`
// parallel. False, with `out` untouched, when a name needs an escape (then
// the general writer does it, through nlohmann).
template <typename Hosts>
bool PlainPriorityListBody(const Hosts& hosts, const std::vector<int64_t>& scores, std::string* out) {
  static constexpr std::string_view kHost = "{\"Host\":\"";
  static constexpr std::string_view kScore = "\",\"Score\":";
  size_t size = 2;
  for (size_t i = 0; i < scores.size(); ++i) {
    const std::string_view h = hosts[i];
    for (char c : h) {
      if (!(c >= 0x20 && c < 0x7f && c != '"' && c != '\\')) return false;
    }
    size += kHost.size() + h.size() + kScore.size() + 20 + 2;  // 20: any int64
  }
  std::string body(size, '\0');
  char* p = body.data();
  *p++ = '[';
  for (size_t i = 0; i < scores.size(); ++i) {
    if (i > 0) *p++ = ',';
    const std::string_view h = hosts[i];
    std::memcpy(p, kHost.data(), kHost.size());
    p += kHost.size();
    if (!h.empty()) std::memcpy(p, h.data(), h.size());
    p += h.size();
    std::memcpy(p, kScore.data(), kScore.size());
    p += kScore.size();
    p = std::to_chars(p, body.data() + body.size(), scores[i]).ptr;
    *p++ = '}';
  }
  *p++ = ']';
  body.resize(static_cast<size_t>(p - body.data()));
  *out = std::move(body);
  return true;
}

template <typename Hosts>
std::string AnyPriorityListBody(const Hosts& hosts, const std::vector<int64_t>& scores) {
  std::string out;
  if (PlainPriorityListBody(hosts, scores, &out)) return out;
  out.reserve(2 + 40 * scores.size());
  out.push_back('[');
  for (size_t i = 0; i < scores.size(); ++i) {
    if (i > 0) out.push_back(',');
    out.append("{\"Host\":");
    AppendString(std::string(hosts[i]), &out);
    absl::StrAppend(&out, ",\"Score\":", scores[i], "}");
  }
  out.push_back(']');
  return out;
}

}  // namespace

std::string PriorityListBody(const std::vector<std::string>& hosts, const std::vector<int64_t>& scores) {
  return AnyPriorityListBody(hosts, scores);
}

std::string PriorityListBodyOfViews(const std::vector<std::string_view>& hosts,
                                   const std::vector<int64_t>& scores) {
  return AnyPriorityListBody(hosts, scores);
}

PodRef PodRefOf(const json& pod) {
  PodRef r;
  auto str = [&](std::initializer_list<const char*> keys) {
    const json* v = Path(pod, keys);
    return v != nullptr && v->is_string() ? v->get<std::string>() : std::string();
  };
  r.ns = str({"metadata", "namespace"});
  if (r.ns.empty()) r.ns = "default";
  r.name = str({"metadata", "name"});
  r.uid = str({"metadata", "uid"});
  r.node_name = str({"spec", "nodeName"});
  return r;
}

absl::StatusOr<placement::PodRequest> ParsePodRequest(const json& pod) {
  // nlohmann's accessors throw on a type mismatch; everything above checks
  // types first, but this is the one place that would catch a slip.
  try {
    absl::StatusOr<placement::PodRequest> r = ParsePodRequestOrThrow(pod);
    if (r.ok()) r->ResolveModelIds();  // the filter compares ids, not names, per device
    return r;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("Pod: ", e.what()));
  }
}

}  // namespace extender
}  // namespace duet
