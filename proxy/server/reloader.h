// File: reloader.h
//
// A configuration reload (SIGHUP), apart from the parts it acts on: which
// settings changed, which of them apply while dpproxy runs and which wait
// for the next start, and the order they apply in. Each kind of change is
// one call on the Host, which owns the parts; each applied kind is one
// event, and the whole reload one `config_reloaded` event and a log line
// per setting.
//
// What applies while running:
//   backends       static backends added (dialled from now on) or removed
//                  (the connection ends; its devices are shown Unhealthy,
//                  and a start leaves it out once no pod holds them);
//   backend_loss   the loss policy and hold of every resource;
//   timeouts.backend, timeouts.dial, cdi_annotations   from the next call;
//   renames, id_maps, compact_ids   each resource they change has its
//                  plugin dialled again, under its new name or with its
//                  new IDs; not in DRA mode;
//   paths          where dpproxy runs both sides: each resource whose
//                  path changed is registered with the kubelet's device
//                  manager, or published in the DRA pool, or taken from
//                  either; its plugin's connection stays.
// Names apply before static backends: a backend added under a new name is
// dialled for that name.
//
//   Reloader reloader(&host, &events, /*dra=*/false);
//   Reloader::Result r = reloader.Reload(running, next);
#ifndef DPPROXY_PROXY_SERVER_RELOADER_H_
#define DPPROXY_PROXY_SERVER_RELOADER_H_

#include <string>
#include <vector>

#include "proxy/config/proxy_config.h"
#include "proxy/events/event_log.h"

namespace dpproxy {

class Reloader {
 public:
  struct Result {
    std::vector<std::string> applied;        // "path: old -> new"
    std::vector<std::string> needs_restart;  // the same, not applied
  };

  // What a reload changes, each called at most once per reload, in this
  // order, from the reloading thread.
  class Host {
   public:
    virtual ~Host() = default;
    virtual void ApplyLossPolicy(const ProxyConfig& next) = 0;
    virtual void ApplyCallSettings(const ProxyConfig& next) = 0;
    virtual void ApplyServedNames(const ProxyConfig& next) = 0;
    virtual void ApplyPaths(const ProxyConfig& next) = 0;
    // Per static backend no longer configured, then per new one, then
    // once with the whole new list.
    virtual void RemoveStaticBackend(const StaticBackendConfig& b) = 0;
    virtual void AddStaticBackend(const StaticBackendConfig& b) = 0;
    virtual void StaticBackendsApplied(const ProxyConfig& next) = 0;
  };

  // `dra`: some resource goes through DRA, and renames and ID maps wait
  // for the next start. `both_sides`: dpproxy runs the device-plugin and
  // the DRA side, and `paths` applies while running.
  Reloader(Host* host, EventLog* events, bool dra, bool both_sides = false)
      : host_(host), events_(events), dra_(dra), both_sides_(both_sides) {}

  // `running`: the configuration as the previous reloads left it; `next`
  // is valid (ValidateConfig).
  Result Reload(const ProxyConfig& running, const ProxyConfig& next);

 private:
  void ApplyStaticBackends(const ProxyConfig& running, const ProxyConfig& next);

  Host* const host_;
  EventLog* const events_;
  const bool dra_;
  const bool both_sides_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_SERVER_RELOADER_H_
