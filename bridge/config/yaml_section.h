#pragma once

// A strict reader for one YAML mapping: known keys are taken with typed
// getters, and Finish() rejects every key nobody asked for. Errors name the
// full key path (`inventory.file`, `nodes[2].gpus.count`). Shared by the
// config and the inventory file so both report errors the same way.
//
// yaml-cpp may throw from its accessors; callers wrap their use of a Section
// in one try/catch (see ParseConfig).

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "yaml-cpp/yaml.h"

namespace duet {

// Walks a YAML mapping, taking known keys; anything left is an error.
class Section {
 public:
  Section(const YAML::Node& node, std::string path) : node_(node), path_(std::move(path)) {}

  // OK for a mapping or an absent/null node.
  absl::Status Check() const {
    if (!node_ || node_.IsNull()) return absl::OkStatus();
    if (!node_.IsMap()) return absl::InvalidArgumentError(Path("") + ": must be a mapping");
    return absl::OkStatus();
  }

  YAML::Node Child(const std::string& key) {
    seen_.insert(key);
    // Absent stays absent: a default YAML::Node would be a defined null.
    if (!node_ || !node_.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    return node_[key];
  }

  absl::Status String(const std::string& key, std::string* out) {
    YAML::Node n = Child(key);
    if (!n) return absl::OkStatus();
    if (!n.IsScalar()) return absl::InvalidArgumentError(Path(key) + ": must be a string");
    *out = n.Scalar();
    return absl::OkStatus();
  }

  absl::Status Bool(const std::string& key, bool* out) {
    YAML::Node n = Child(key);
    if (!n) return absl::OkStatus();
    const std::string& s = n.IsScalar() ? n.Scalar() : "";
    if (s == "true" || s == "True" || s == "yes" || s == "on") {
      *out = true;
    } else if (s == "false" || s == "False" || s == "no" || s == "off") {
      *out = false;
    } else {
      return absl::InvalidArgumentError(Path(key) + ": must be true or false");
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status Int(const std::string& key, T* out) {
    YAML::Node n = Child(key);
    if (!n) return absl::OkStatus();
    int64_t v;
    if (!n.IsScalar() || !absl::SimpleAtoi(n.Scalar(), &v)) {
      return absl::InvalidArgumentError(Path(key) + ": must be an integer");
    }
    if (v < 0) return absl::InvalidArgumentError(Path(key) + ": must not be negative");
    *out = static_cast<T>(v);
    return absl::OkStatus();
  }

  absl::Status Double(const std::string& key, double* out) {
    YAML::Node n = Child(key);
    if (!n) return absl::OkStatus();
    double v;
    if (!n.IsScalar() || !absl::SimpleAtod(n.Scalar(), &v) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(Path(key) + ": must be a number");
    }
    *out = v;
    return absl::OkStatus();
  }

  absl::Status Duration(const std::string& key, absl::Duration* out) {
    YAML::Node n = Child(key);
    if (!n) return absl::OkStatus();
    if (!n.IsScalar() || !absl::ParseDuration(n.Scalar(), out)) {
      return absl::InvalidArgumentError(Path(key) + ": must be a duration like 10s or 500ms");
    }
    return absl::OkStatus();
  }

  absl::Status StringMap(const std::string& key, std::map<std::string, std::string>* out) {
    YAML::Node n = Child(key);
    if (!n) return absl::OkStatus();
    if (!n.IsMap()) return absl::InvalidArgumentError(Path(key) + ": must be a mapping of strings");
    for (const auto& kv : n) {
      if (!kv.second.IsScalar()) {
        return absl::InvalidArgumentError(
            absl::StrCat(Path(key), ".", kv.first.as<std::string>(), ": must be a string"));
      }
      (*out)[kv.first.as<std::string>()] = kv.second.Scalar();
    }
    return absl::OkStatus();
  }

  absl::Status StringList(const std::string& key, std::vector<std::string>* out) {
    YAML::Node n = Child(key);
    if (!n) return absl::OkStatus();
    if (!n.IsSequence()) return absl::InvalidArgumentError(Path(key) + ": must be a list of strings");
    for (size_t i = 0; i < n.size(); ++i) {
      if (!n[i].IsScalar()) {
        return absl::InvalidArgumentError(absl::StrCat(Path(key), "[", i, "]: must be a string"));
      }
      out->push_back(n[i].Scalar());
    }
    return absl::OkStatus();
  }

  // Unknown keys are errors: a typo must not silently fall back to a default.
  absl::Status Finish() const {
    if (!node_ || !node_.IsMap()) return absl::OkStatus();
    for (const auto& kv : node_) {
      const std::string key = kv.first.as<std::string>();
      if (!seen_.count(key)) return absl::InvalidArgumentError(Path(key) + ": unknown key");
    }
    return absl::OkStatus();
  }

  std::string Path(const std::string& key) const {
    if (path_.empty()) return key;
    if (key.empty()) return path_;
    return absl::StrCat(path_, ".", key);
  }

 private:
  YAML::Node node_;
  std::string path_;
  std::set<std::string> seen_;
};


// Returns from the enclosing function if `expr` is not OK.
#define DUET_YAML(expr)       \
  do {                        \
    absl::Status s_ = (expr); \
    if (!s_.ok()) return s_;  \
  } while (0)

}  // namespace duet
