#include "proxy/holders/cordon_control.h"

#include <algorithm>

#include <glog/logging.h>

#include "absl/time/time.h"
#include "proxy/util/status_macros.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dpproxy {

absl::StatusOr<Cordon> CordonControl::CordonDevice(Cordon c) {
  const std::optional<std::vector<std::string>> devices = devices_of_(c.resource);
  if (!devices.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("resource ", c.resource, " is not served by this dpproxy"));
  }
  if (std::find(devices->begin(), devices->end(), c.device) == devices->end()) {
    constexpr size_t kShown = 8;
    std::vector<std::string> first(devices->begin(),
                                   devices->begin() + std::min(devices->size(), kShown));
    return absl::NotFoundError(absl::StrCat(
        "resource ", c.resource, " has no device ", c.device, " (it lists ", devices->size(),
        " device(s)", devices->empty() ? "" : ": ", absl::StrJoin(first, ", "),
        devices->size() > kShown ? ", ..." : "", ")"));
  }
  DPP_RETURN_IF_ERROR(book_->Set(c));
  LOG(WARNING) << "resource " << c.resource << ": device " << c.device
               << " cordoned (reason: " << c.reason << ") by uid " << c.by_uid << ", pid "
               << c.by_pid << "; shown Unhealthy to the kubelet until uncordoned";
  events_->Emit("device_cordoned", {{"resource", c.resource},
                                    {"device", c.device},
                                    {"reason", c.reason},
                                    {"by_uid", c.by_uid},
                                    {"by_pid", c.by_pid}});
  if (changed_) changed_();
  return c;
}

absl::StatusOr<Cordon> CordonControl::UncordonDevice(const std::string& resource,
                                               const std::string& device,
                                               const OwnerOnlySocket::Peer& by) {
  absl::StatusOr<Cordon> removed = book_->Remove(resource, device);
  if (!removed.ok()) return removed.status();
  LOG(WARNING) << "resource " << resource << ": device " << device << " uncordoned by uid "
               << by.uid << ", pid " << by.pid << " (cordoned since "
               << absl::FormatTime(removed->since) << ": " << removed->reason << ")";
  events_->Emit("device_uncordoned", {{"resource", resource},
                                      {"device", device},
                                      {"was_reason", removed->reason},
                                      {"by_uid", by.uid},
                                      {"by_pid", by.pid}});
  if (changed_) changed_();
  return removed;
}

}  // namespace dpproxy
