#pragma once

// Refuses a YAML document in which one mapping gives a key twice. yaml-cpp
// keeps both entries and its lookups (node[key]) return the first, so a
// second `fsync: true` further down a file would be silently dropped: the
// file would mean something else than it says. Every YAML file duet reads
// (duet-bridge's config, the inventory file, kubeconfig files) goes through
// this right after YAML::Load; duet-node reads no YAML.
//
// Header-only, so the leaf links no YAML parser: its users link yaml-cpp
// (as slurm/slurm_compat.h's users bring Slurm's headers). May throw what
// yaml-cpp throws; callers already catch YAML::Exception around their use.

#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "yaml-cpp/yaml.h"

namespace duet {
namespace yaml_internal {

inline std::string KeyPath(const std::string& path, const std::string& key) {
  return path.empty() ? key : absl::StrCat(path, ".", key);
}

// `visited` holds the positions of the collections already walked: an alias
// (*a) shares its anchor's node, so a document of nested aliases (the
// "billion laughs") is walked once per node, not once per path to it.
inline absl::Status CheckUniqueKeysIn(const YAML::Node& node, const std::string& path,
                                      std::set<size_t>* visited) {
  if (!node.IsMap() && !node.IsSequence()) return absl::OkStatus();
  const int pos = node.Mark().pos;  // where the node starts; -1 for none
  if (pos >= 0 && !visited->insert(static_cast<size_t>(pos)).second) return absl::OkStatus();
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      absl::Status s = CheckUniqueKeysIn(node[i], absl::StrCat(path, "[", i, "]"), visited);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  std::map<std::string, int> first_line;  // key -> its line (1-based)
  for (const auto& kv : node) {
    // A complex key (`? [a, b]`) is not a name anyone reads: no key of ours.
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
    const int line = kv.first.Mark().line + 1;
    if (kv.first.IsScalar()) {
      auto [it, inserted] = first_line.emplace(key, line);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            KeyPath(path, key), ": key given twice in one mapping (line ", it->second,
            " and line ", line, "); YAML keeps only one of them, so the file is refused"));
      }
    }
    absl::Status s = CheckUniqueKeysIn(kv.second, KeyPath(path, key), visited);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace yaml_internal

// OK when no mapping anywhere in `root` repeats a key; else INVALID_ARGUMENT
// naming the key's path (`grpc.tls.cert_file`, `nodes[2].name`) and both
// lines: "grpc.listen: key given twice in one mapping (line 2 and line 5);
// ...". Keys are compared as written (yaml-cpp compares them so too).
inline absl::Status CheckUniqueKeys(const YAML::Node& root) {
  std::set<size_t> visited;
  return yaml_internal::CheckUniqueKeysIn(root, "", &visited);
}

}  // namespace duet
