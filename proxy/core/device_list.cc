#include "proxy/core/device_list.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <glog/logging.h>

#include "absl/hash/hash.h"

namespace dpproxy {

namespace {

using google::protobuf::io::CodedOutputStream;
using google::protobuf::internal::WireFormatLite;

constexpr int kIdField = v1beta1::Device::kIDFieldNumber;
constexpr int kHealthField = v1beta1::Device::kHealthFieldNumber;
constexpr int kTopologyField = v1beta1::Device::kTopologyFieldNumber;
constexpr int kDevicesField = v1beta1::ListAndWatchResponse::kDevicesFieldNumber;

void AppendVarint(uint32_t v, std::string* out) {
  uint8_t buf[5];
  const uint8_t* end = CodedOutputStream::WriteVarint32ToArray(v, buf);
  out->append(reinterpret_cast<const char*>(buf), static_cast<size_t>(end - buf));
}

void AppendBytesField(int field, absl::string_view bytes, std::string* out) {
  AppendVarint(WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED), out);
  AppendVarint(static_cast<uint32_t>(bytes.size()), out);
  out->append(bytes.data(), bytes.size());
}

size_t BytesFieldSize(int field, size_t len) {
  return CodedOutputStream::VarintSize32(
             WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED)) +
         CodedOutputStream::VarintSize32(static_cast<uint32_t>(len)) + len;
}

size_t PayloadSize(const DeviceList::View& d) {
  size_t n = 0;
  if (!d.id.empty()) n += BytesFieldSize(kIdField, d.id.size());
  if (!d.health.empty()) n += BytesFieldSize(kHealthField, d.health.size());
  if (d.has_topology) n += BytesFieldSize(kTopologyField, d.topology.size());
  return n;
}

// Reads a varint at `*p` (before `end`); false if it is cut short.
bool ReadVarint(const char** p, const char* end, uint64_t* v) {
  *v = 0;
  for (int shift = 0; *p < end && shift < 64; shift += 7) {
    const uint8_t b = static_cast<uint8_t>(*(*p)++);
    *v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

// The payload of the length-delimited entry at `p` (its tag first).
absl::string_view EntryPayload(const char* p, const char* end) {
  uint64_t tag = 0, len = 0;
  if (!ReadVarint(&p, end, &tag) || !ReadVarint(&p, end, &len) ||
      len > static_cast<uint64_t>(end - p)) {
    return {};
  }
  return absl::string_view(p, static_cast<size_t>(len));
}

// The fields of a Device payload this list wrote (any order is read; fields
// of other types are skipped).
DeviceList::View ParseDevice(absl::string_view payload) {
  DeviceList::View d;
  const char* p = payload.data();
  const char* end = p + payload.size();
  while (p < end) {
    uint64_t tag = 0;
    if (!ReadVarint(&p, end, &tag)) break;
    const int field = static_cast<int>(tag >> 3);
    const int type = static_cast<int>(tag & 7);
    uint64_t v = 0;
    if (type == WireFormatLite::WIRETYPE_VARINT) {
      if (!ReadVarint(&p, end, &v)) break;
      continue;
    }
    if (type != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) break;  // never written
    if (!ReadVarint(&p, end, &v) || v > static_cast<uint64_t>(end - p)) break;
    const absl::string_view bytes(p, static_cast<size_t>(v));
    p += v;
    if (field == kIdField) {
      d.id = bytes;
    } else if (field == kHealthField) {
      d.health = bytes;
    } else if (field == kTopologyField) {
      d.has_topology = true;
      d.topology = bytes;
    }
  }
  return d;
}

}  // namespace

void AppendDeviceField(int field_number, const DeviceList::View& d, std::string* out) {
  AppendVarint(WireFormatLite::MakeTag(field_number, WireFormatLite::WIRETYPE_LENGTH_DELIMITED),
               out);
  AppendVarint(static_cast<uint32_t>(PayloadSize(d)), out);
  if (!d.id.empty()) AppendBytesField(kIdField, d.id, out);
  if (!d.health.empty()) AppendBytesField(kHealthField, d.health, out);
  if (d.has_topology) AppendBytesField(kTopologyField, d.topology, out);
}

DeviceList::DeviceList(Private, std::string wire, std::vector<uint32_t> starts)
    : wire_(std::move(wire)),
      starts_(std::move(starts)),
      index_(starts_.size(), IdHash{this}, IdEq{this}) {
  for (uint32_t i = 0; i < starts_.size(); ++i) {
    index_.insert(i);  // a duplicate ID keeps its first position
    if (device(static_cast<int>(i)).health == "Healthy") ++healthy_;
  }
}

std::shared_ptr<const DeviceList> DeviceList::Make(std::string wire,
                                                   std::vector<uint32_t> starts) {
  wire.shrink_to_fit();
  starts.shrink_to_fit();
  return std::make_shared<const DeviceList>(Private{}, std::move(wire), std::move(starts));
}

std::shared_ptr<const DeviceList> DeviceList::Empty() {
  static const auto* empty = new std::shared_ptr<const DeviceList>(Make({}, {}));
  return *empty;
}

std::shared_ptr<const DeviceList> DeviceList::FromDevices(std::vector<v1beta1::Device> devices) {
  std::vector<std::string> topologies(devices.size());
  size_t total = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    const v1beta1::Device& d = devices[i];
    if (d.has_topology()) topologies[i] = d.topology().SerializeAsString();
    View v{d.id(), d.health(), d.has_topology(), topologies[i]};
    total += BytesFieldSize(kDevicesField, PayloadSize(v));
  }
  std::string wire;
  wire.reserve(total);
  std::vector<uint32_t> starts;
  starts.reserve(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    v1beta1::Device& d = devices[i];
    starts.push_back(static_cast<uint32_t>(wire.size()));
    AppendDeviceField(kDevicesField, View{d.id(), d.health(), d.has_topology(), topologies[i]},
                      &wire);
    d = v1beta1::Device();
    std::string().swap(topologies[i]);
  }
  return Make(std::move(wire), std::move(starts));
}

std::shared_ptr<const DeviceList> DeviceList::FromMessage(
    const v1beta1::ListAndWatchResponse& msg) {
  return FromDevices({msg.devices().begin(), msg.devices().end()});
}

DeviceList::View DeviceList::device(int i) const {
  const char* begin = wire_.data();
  return ParseDevice(EntryPayload(begin + starts_[static_cast<size_t>(i)], begin + wire_.size()));
}

absl::string_view DeviceList::IdAt(uint32_t i) const { return device(static_cast<int>(i)).id; }

size_t DeviceList::IdHash::operator()(uint32_t i) const { return (*this)(list->IdAt(i)); }
size_t DeviceList::IdHash::operator()(absl::string_view id) const {
  return absl::Hash<absl::string_view>()(id);
}
bool DeviceList::IdEq::operator()(uint32_t a, uint32_t b) const {
  return list->IdAt(a) == list->IdAt(b);
}
bool DeviceList::IdEq::operator()(uint32_t a, absl::string_view b) const {
  return list->IdAt(a) == b;
}

std::optional<int> DeviceList::Find(absl::string_view id) const {
  auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  return static_cast<int>(*it);
}

std::shared_ptr<const std::string> DeviceList::shared_wire() const {
  return std::shared_ptr<const std::string>(shared_from_this(), &wire_);
}

v1beta1::Device DeviceList::ToDevice(int i) const {
  const View v = device(i);
  v1beta1::Device d;
  d.set_id(std::string(v.id));
  d.set_health(std::string(v.health));
  if (v.has_topology) {
    CHECK(d.mutable_topology()->ParseFromArray(v.topology.data(),
                                               static_cast<int>(v.topology.size())));
  }
  return d;
}

std::vector<v1beta1::Device> DeviceList::ToDevices() const {
  std::vector<v1beta1::Device> out;
  out.reserve(starts_.size());
  for (int i = 0; i < size(); ++i) out.push_back(ToDevice(i));
  return out;
}

v1beta1::ListAndWatchResponse DeviceList::ToMessage() const {
  v1beta1::ListAndWatchResponse msg;
  CHECK(msg.ParseFromString(wire_));
  return msg;
}

std::shared_ptr<const DeviceList> DeviceList::WithHealth(
    const std::function<absl::string_view(const View&)>& health) const {
  std::vector<absl::string_view> changed(starts_.size());
  bool any = false;
  for (int i = 0; i < size(); ++i) {
    const View v = device(i);
    const absl::string_view h = health(v);
    if (!h.empty() && h != v.health) {
      changed[static_cast<size_t>(i)] = h;
      any = true;
    }
  }
  if (!any) return shared_from_this();
  std::string wire;
  wire.reserve(wire_.size() + starts_.size() * 4);
  std::vector<uint32_t> starts;
  starts.reserve(starts_.size());
  for (int i = 0; i < size(); ++i) {
    View v = device(i);
    if (!changed[static_cast<size_t>(i)].empty()) v.health = changed[static_cast<size_t>(i)];
    starts.push_back(static_cast<uint32_t>(wire.size()));
    AppendDeviceField(kDevicesField, v, &wire);
  }
  return Make(std::move(wire), std::move(starts));
}

void DeviceList::AppendAsField(int field_number, std::string* out) const {
  if (field_number == kDevicesField) {
    out->append(wire_);
    return;
  }
  out->reserve(out->size() + wire_.size() + starts_.size());
  for (int i = 0; i < size(); ++i) AppendDeviceField(field_number, device(i), out);
}

}  // namespace dpproxy
