// File: device_list.h
//
// One resource's device list, immutable, held in the form the kubelet is
// sent: the bytes of a v1beta1 ListAndWatchResponse, plus a table of where
// each device starts and a hash index over their IDs that stores positions,
// not copies. A device costs its wire bytes and about ten bytes more, where
// a parsed message costs some two hundred; every kubelet stream writes the
// same bytes without serializing them again.
//
//   std::shared_ptr<const DeviceList> list = DeviceList::FromDevices(std::move(devices));
//   if (auto i = list->Find("gpu-0")) LOG(INFO) << list->device(*i).health;
//   std::shared_ptr<const DeviceList> shown =
//       list->WithHealth([](const DeviceList::View& d) { return absl::string_view("Unhealthy"); });
//
// Thread-safe: every method is const and the list never changes.
#ifndef DPPROXY_PROXY_CORE_DEVICE_LIST_H_
#define DPPROXY_PROXY_CORE_DEVICE_LIST_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/v1beta1/api.pb.h"

namespace dpproxy {

class DeviceList : public std::enable_shared_from_this<DeviceList> {
 public:
  // One device, viewed in the list's bytes (valid while the list lives).
  struct View {
    absl::string_view id;
    absl::string_view health;
    // The TopologyInfo message's bytes, when the device has one (a device
    // may carry an empty one: the kubelet tells "none" from "empty").
    bool has_topology = false;
    absl::string_view topology;
  };

  // The empty list, shared.
  static std::shared_ptr<const DeviceList> Empty();
  // The devices, in order; each message is freed as it is encoded.
  static std::shared_ptr<const DeviceList> FromDevices(std::vector<v1beta1::Device> devices);
  // Reads the bytes of a ListAndWatchResponse as a plugin sent them (v1beta1,
  // or v1alpha with `with_topology` false: a field v1alpha does not have is
  // then ignored, as a v1alpha reader would). Devices are re-encoded; fields
  // no Device has are dropped. kInvalidArgument naming the problem if the
  // bytes are not such a message (as protobuf would refuse them: a cut
  // field, a wrong wire type, a string that is not UTF-8).
  static absl::StatusOr<std::shared_ptr<const DeviceList>> FromWire(absl::string_view wire,
                                                                    bool with_topology = true);

  // Builds a list one device at a time.
  class Builder {
   public:
    explicit Builder(size_t expected_devices = 0, size_t expected_bytes = 0);
    // Copies the device's bytes (views may point into another list).
    void Add(const View& d);
    std::shared_ptr<const DeviceList> Build() &&;

   private:
    std::string wire_;
    std::vector<uint32_t> starts_;
  };

  DeviceList(const DeviceList&) = delete;
  DeviceList& operator=(const DeviceList&) = delete;

  int size() const { return static_cast<int>(starts_.size()); }
  bool empty() const { return starts_.empty(); }
  // Device `i`, 0 <= i < size(). O(1).
  View device(int i) const;
  // The position of the device with ID `id`, or nullopt. O(1).
  std::optional<int> Find(absl::string_view id) const;
  bool Contains(absl::string_view id) const { return Find(id).has_value(); }
  // Devices whose health is exactly "Healthy".
  int healthy() const { return healthy_; }

  // The v1beta1 ListAndWatchResponse this list is, as sent on the wire.
  const std::string& wire() const { return wire_; }
  size_t bytes() const { return wire_.size(); }
  // The wire bytes kept alive by the list, for a gRPC write that must not
  // copy them: the pointer shares this list's lifetime.
  std::shared_ptr<const std::string> shared_wire() const;

  v1beta1::Device ToDevice(int i) const;
  std::vector<v1beta1::Device> ToDevices() const;
  v1beta1::ListAndWatchResponse ToMessage() const;

  // This list with each device's health replaced by `health(view)` where
  // that is not empty. Returns this very list (shared, no copy) when no
  // device would change.
  std::shared_ptr<const DeviceList> WithHealth(
      const std::function<absl::string_view(const View&)>& health) const;

 private:
  // Hashes and compares positions by the ID they hold; a string_view finds
  // a position without building one.
  struct IdHash {
    using is_transparent = void;
    const DeviceList* list;
    size_t operator()(uint32_t i) const;
    size_t operator()(absl::string_view id) const;
  };
  struct IdEq {
    using is_transparent = void;
    const DeviceList* list;
    bool operator()(uint32_t a, uint32_t b) const;
    bool operator()(uint32_t a, absl::string_view b) const;
    bool operator()(absl::string_view a, uint32_t b) const { return (*this)(b, a); }
  };
  struct Private {};

 public:
  // Use the factories. (Public for std::make_shared.)
  DeviceList(Private, std::string wire, std::vector<uint32_t> starts);

 private:
  absl::string_view IdAt(uint32_t i) const;
  static std::shared_ptr<const DeviceList> Make(std::string wire, std::vector<uint32_t> starts);
  // FromWire's reading of one Device message (`bytes`) into `d`, whose
  // views point into `bytes` or, for a topology sent in parts, `merged`.
  static absl::Status ReadDevice(absl::string_view bytes, bool with_topology, View* d,
                                 std::string* merged);

  const std::string wire_;
  // Where device i's entry (its field tag in the ListAndWatchResponse)
  // starts in wire_.
  const std::vector<uint32_t> starts_;
  int healthy_ = 0;
  absl::flat_hash_set<uint32_t, IdHash, IdEq> index_;
};

// Appends one device as a length-delimited field numbered `field_number`,
// encoded the way protobuf encodes a Device (fields in order, empty strings
// left out), its topology given as that message's bytes.
void AppendDeviceField(int field_number, const DeviceList::View& d, std::string* out);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_CORE_DEVICE_LIST_H_
