// File: flap_damper.h
//
// Damps devices whose health flaps: a device that turns Unhealthy more
// than `flaps` times within `window` is held Unhealthy for `backoff`, and
// each further turn while held doubles the hold (up to `max_backoff`)
// from that moment. The hold ends when it has run out; an episode is told
// once when it starts and once when it ends, never per flip.
//
// No I/O, no lock: its owner (Resource) calls it under its own lock.
#ifndef DPPROXY_PROXY_CORE_FLAP_DAMPER_H_
#define DPPROXY_PROXY_CORE_FLAP_DAMPER_H_

#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proxy/config/proxy_config.h"

namespace dpproxy {

class FlapDamper {
 public:
  // An episode that started or ended at this step.
  struct Episode {
    std::string device;
    int flaps = 0;                   // turns to Unhealthy within the window
    absl::Duration held_for;         // started: the hold; ended: how long it lasted
  };
  struct Changes {
    std::vector<Episode> started, ended;
    bool empty() const { return started.empty() && ended.empty(); }
  };

  explicit FlapDamper(const FlapDamping& settings = {}) : settings_(settings) {}

  // From now on; turned off, every hold ends (and is told as ended).
  Changes SetSettings(const FlapDamping& settings, absl::Time now);
  bool on() const { return settings_.flaps > 0; }
  const FlapDamping& settings() const { return settings_; }

  // A device's health as the plugin reported it at `now` (every device of
  // each list, in any order).
  void Observe(absl::string_view device, bool healthy, absl::Time now);
  // Ends the holds run out by `now`, and forgets devices quiet for long.
  Changes Tick(absl::Time now);
  // What Observe started since the last call.
  Changes TakeStarted();

  // Whether `device` is held Unhealthy now.
  bool damped(absl::string_view device) const;
  // The devices held Unhealthy now.
  std::set<std::string> Damped() const;
  // When the next hold runs out (InfiniteFuture: none).
  absl::Time next_release() const;

 private:
  struct Device {
    bool healthy = true;
    std::deque<absl::Time> turns;  // to Unhealthy, within the window
    absl::Time held_until = absl::InfinitePast();
    absl::Time held_since;
    absl::Duration hold;           // the current hold, doubling per turn
  };

  FlapDamping settings_;
  std::map<std::string, Device, std::less<>> devices_;
  Changes started_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_CORE_FLAP_DAMPER_H_
