// File: resource_table.h
//
// Every resource dpproxy serves, by the name the kubelet knows it by, and
// the configuration as the reloads since the start left it. The parts of
// the server (static backends, what is withheld, reporting, saving) read it; only
// ProxyServer adds to it.
//
// An entry's parts live as long as the table (until TakeAll at shutdown),
// so a pointer from All() or Find() stays valid without the lock. The few
// values a backend attaching or a reload changes are read and written
// through the table, under its lock.
//
//   ResourceTable table(config);
//   ServedResource* e = table.Add("example.com/gpu", std::move(made));
//   for (ServedResource* e : table.All()) e->resource->Tick(now);
#ifndef DPPROXY_PROXY_SERVER_RESOURCE_TABLE_H_
#define DPPROXY_PROXY_SERVER_RESOURCE_TABLE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proxy/config/proxy_config.h"
#include "proxy/core/allocator.h"
#include "proxy/core/resource.h"

namespace dpproxy {

// One resource as served: its devices and backend, and its one Allocate,
// which the kubelet-facing side serves (kubelet_side.h).
struct ServedResource {
  std::unique_ptr<Resource> resource;
  std::unique_ptr<Allocator> allocator;  // allocator.h
};

class ResourceTable {
 public:
  // What may change of an entry after it was made, read as one.
  struct Facts {
    // The plugin's resource name: the current backend's, or the last one's
    // (from the state file after a restart); "" if none yet.
    std::string backend_resource;
    // The kubelet API from the state file, until registered again.
    std::string restored_kubelet_api;
  };

  explicit ResourceTable(const ProxyConfig& config) : live_(config) {}

  ResourceTable(const ResourceTable&) = delete;
  ResourceTable& operator=(const ResourceTable&) = delete;

  // In order of name.
  std::vector<ServedResource*> All() ABSL_LOCKS_EXCLUDED(mu_);
  ServedResource* Find(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  // Adds `made` under `name` unless an entry is there already; returns
  // the entry under `name`, and whether it is `made`.
  std::pair<ServedResource*, bool> Add(const std::string& name,
                                       std::unique_ptr<ServedResource> made)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Empties the table (shutdown): the caller owns the entries now.
  std::map<std::string, std::unique_ptr<ServedResource>> TakeAll() ABSL_LOCKS_EXCLUDED(mu_);

  Facts facts(const ServedResource* e) ABSL_LOCKS_EXCLUDED(mu_);
  void SetBackendResource(const ServedResource* e, const std::string& plugin)
      ABSL_LOCKS_EXCLUDED(mu_);
  void SetRestored(const ServedResource* e, const Facts& facts) ABSL_LOCKS_EXCLUDED(mu_);
  // Each entry's name and facts, in order of name.
  std::vector<std::pair<ServedResource*, Facts>> AllWithFacts() ABSL_LOCKS_EXCLUDED(mu_);

  // The configuration as the reloads left it (a copy), and a change to it.
  ProxyConfig live() ABSL_LOCKS_EXCLUDED(mu_);
  // PathOf(live(), resource), without copying the configuration.
  KubeletPath PathOf(const std::string& resource) ABSL_LOCKS_EXCLUDED(mu_);
  void UpdateLive(const std::function<void(ProxyConfig&)>& change) ABSL_LOCKS_EXCLUDED(mu_);
  // The kubelet-facing name of a plugin's resource, after renames as a
  // reload left them.
  std::string ServedName(const std::string& backend_resource) ABSL_LOCKS_EXCLUDED(mu_);

  // Grows when what Withheld reads changes other than through the
  // state keeper: a backend attached, a reload of names, IDs or static
  // backends.
  void NoteServedChange() { ++served_version_; }
  uint64_t served_version() const { return served_version_.load(); }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<ServedResource>> entries_ ABSL_GUARDED_BY(mu_);
  std::map<const ServedResource*, Facts> facts_ ABSL_GUARDED_BY(mu_);
  ProxyConfig live_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> served_version_{0};
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_SERVER_RESOURCE_TABLE_H_
