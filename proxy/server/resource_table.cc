#include "proxy/server/resource_table.h"

namespace dpproxy {

std::vector<ServedResource*> ResourceTable::All() {
  std::vector<ServedResource*> out;
  absl::MutexLock lock(&mu_);
  out.reserve(entries_.size());
  for (auto& [name, e] : entries_) out.push_back(e.get());
  return out;
}

ServedResource* ResourceTable::Find(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second.get();
}

std::pair<ServedResource*, bool> ResourceTable::Add(const std::string& name,
                                                    std::unique_ptr<ServedResource> made) {
  absl::MutexLock lock(&mu_);
  auto [it, added] = entries_.try_emplace(name, nullptr);
  if (added) {
    it->second = std::move(made);
    facts_[it->second.get()];
  }
  return {it->second.get(), added};
}

std::map<std::string, std::unique_ptr<ServedResource>> ResourceTable::TakeAll() {
  std::map<std::string, std::unique_ptr<ServedResource>> out;
  absl::MutexLock lock(&mu_);
  out.swap(entries_);
  facts_.clear();
  return out;
}

ResourceTable::Facts ResourceTable::facts(const ServedResource* e) {
  absl::MutexLock lock(&mu_);
  auto it = facts_.find(e);
  return it == facts_.end() ? Facts() : it->second;
}

void ResourceTable::SetBackendResource(const ServedResource* e, const std::string& plugin) {
  absl::MutexLock lock(&mu_);
  auto it = facts_.find(e);
  if (it != facts_.end()) it->second.backend_resource = plugin;
}

void ResourceTable::SetRestored(const ServedResource* e, const Facts& facts) {
  absl::MutexLock lock(&mu_);
  auto it = facts_.find(e);
  if (it != facts_.end()) it->second = facts;
}

std::vector<std::pair<ServedResource*, ResourceTable::Facts>> ResourceTable::AllWithFacts() {
  std::vector<std::pair<ServedResource*, Facts>> out;
  absl::MutexLock lock(&mu_);
  out.reserve(entries_.size());
  for (auto& [name, e] : entries_) out.emplace_back(e.get(), facts_[e.get()]);
  return out;
}

KubeletPath ResourceTable::PathOf(const std::string& resource) {
  absl::MutexLock lock(&mu_);
  return ::dpproxy::PathOf(live_, resource);
}

ProxyConfig ResourceTable::live() {
  absl::MutexLock lock(&mu_);
  return live_;
}

void ResourceTable::UpdateLive(const std::function<void(ProxyConfig&)>& change) {
  absl::MutexLock lock(&mu_);
  change(live_);
}

std::string ResourceTable::ServedName(const std::string& backend_resource) {
  absl::MutexLock lock(&mu_);
  return KubeletResourceName(live_, backend_resource);
}

}  // namespace dpproxy
