// File: cordon_control.h
//
// Devices taken out of service by hand (`dpctl cordon`): the control
// socket's requests checked against what dpproxy serves, kept in the
// cordon book (proxy/state/cordon_book.h), and told (a log line and an
// event naming who asked). What a cordon does is Withheld's: the device is
// shown Unhealthy to the kubelet, and in DRA mode leaves the pool.
#ifndef DPPROXY_PROXY_HOLDERS_CORDON_CONTROL_H_
#define DPPROXY_PROXY_HOLDERS_CORDON_CONTROL_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "proxy/control/control_server.h"
#include "proxy/events/event_log.h"
#include "proxy/state/cordon_book.h"

namespace dpproxy {

class CordonControl final : public ControlServer::Host {
 public:
  // The devices (kubelet IDs) `resource` shows the kubelet now, or nullopt
  // if it is not served.
  using DevicesOf = std::function<std::optional<std::vector<std::string>>(const std::string&)>;

  // `changed` runs after each change is on disk (Withheld applies it).
  CordonControl(CordonBook* book, DevicesOf devices_of, EventLog* events, std::function<void()> changed)
      : book_(book),
        devices_of_(std::move(devices_of)),
        events_(events),
        changed_(std::move(changed)) {}

  // A device of a resource dpproxy serves and lists: kNotFound naming what
  // is not known otherwise.
  absl::StatusOr<Cordon> CordonDevice(Cordon c) override;
  // Any cordoned device, listed or not.
  absl::StatusOr<Cordon> UncordonDevice(const std::string& resource, const std::string& device,
                                        const OwnerOnlySocket::Peer& by) override;
  std::vector<Cordon> Cordons() override { return book_->List(); }

 private:
  CordonBook* const book_;
  const DevicesOf devices_of_;
  EventLog* const events_;
  const std::function<void()> changed_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_HOLDERS_CORDON_CONTROL_H_
