#include "proxy/core/device_list.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <glog/logging.h>

#include <google/protobuf/stubs/common.h>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"

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

// A field tag or a length, read as protobuf reads them: at most five bytes;
// a tag keeps its low 32 bits, a length must fit an int32.
bool ReadTag(const char** p, const char* end, uint64_t* v) {
  const char* start = *p;
  if (!ReadVarint(p, end, v) || *p - start > 5) return false;
  *v &= 0xffffffffu;
  return (*v >> 3) != 0;
}
bool ReadSize(const char** p, const char* end, uint64_t* v) {
  const char* start = *p;
  return ReadVarint(p, end, v) && *p - start <= 5 && *v <= 0x7fffffff &&
         *v <= static_cast<uint64_t>(end - *p);
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
  // Sized first, so the bytes are allocated once. A topology is encoded
  // twice (sized, then written); devices rarely have one.
  size_t total = 0;
  for (const v1beta1::Device& d : devices) {
    const size_t topology = d.has_topology() ? d.topology().ByteSizeLong() : 0;
    size_t payload = 0;
    if (!d.id().empty()) payload += BytesFieldSize(kIdField, d.id().size());
    if (!d.health().empty()) payload += BytesFieldSize(kHealthField, d.health().size());
    if (d.has_topology()) payload += BytesFieldSize(kTopologyField, topology);
    total += BytesFieldSize(kDevicesField, payload);
  }
  std::string wire;
  wire.reserve(total);
  std::vector<uint32_t> starts;
  starts.reserve(devices.size());
  std::string topology;
  for (v1beta1::Device& d : devices) {
    starts.push_back(static_cast<uint32_t>(wire.size()));
    topology.clear();
    if (d.has_topology()) d.topology().AppendToString(&topology);
    AppendDeviceField(kDevicesField, View{d.id(), d.health(), d.has_topology(), topology}, &wire);
    d = v1beta1::Device();  // freed as it is encoded
  }
  return Make(std::move(wire), std::move(starts));
}

DeviceList::Builder::Builder(size_t expected_devices, size_t expected_bytes) {
  starts_.reserve(expected_devices);
  wire_.reserve(expected_bytes);
}

void DeviceList::Builder::Add(const View& d) {
  starts_.push_back(static_cast<uint32_t>(wire_.size()));
  AppendDeviceField(kDevicesField, d, &wire_);
}

std::shared_ptr<const DeviceList> DeviceList::Builder::Build() && {
  return Make(std::move(wire_), std::move(starts_));
}

namespace {

bool LengthDelimited(uint64_t tag) {
  return (tag & 7) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
}

// Skips the field `tag` introduces the way protobuf skips an unknown one (a
// known field number with another wire type is unknown too); a group is
// skipped to its end. False if the field is cut short or of an unknown
// wire type.
bool SkipField(uint64_t tag, const char** p, const char* end, int depth) {
  uint64_t v = 0;
  switch (static_cast<int>(tag & 7)) {
    case WireFormatLite::WIRETYPE_VARINT:
      return ReadVarint(p, end, &v);
    case WireFormatLite::WIRETYPE_FIXED64:
      if (end - *p < 8) return false;
      *p += 8;
      return true;
    case WireFormatLite::WIRETYPE_FIXED32:
      if (end - *p < 4) return false;
      *p += 4;
      return true;
    case WireFormatLite::WIRETYPE_LENGTH_DELIMITED:
      if (!ReadSize(p, end, &v)) return false;
      *p += v;
      return true;
    case WireFormatLite::WIRETYPE_START_GROUP:
      if (depth > 64) return false;
      while (*p < end) {
        uint64_t inner = 0;
        if (!ReadTag(p, end, &inner)) return false;
        if ((inner & 7) == WireFormatLite::WIRETYPE_END_GROUP) return (inner >> 3) == (tag >> 3);
        if (!SkipField(inner, p, end, depth + 1)) return false;
      }
      return false;
    default:
      return false;
  }
}

}  // namespace

absl::Status DeviceList::ReadDevice(absl::string_view bytes, bool with_topology, View* d,
                                    std::string* merged) {
  const char* q = bytes.data();
  const char* const end = q + bytes.size();
  while (q < end) {
    uint64_t tag = 0;
    if (!ReadTag(&q, end, &tag)) return absl::InvalidArgumentError("a malformed field tag");
    const int field = static_cast<int>(tag >> 3);
    const bool known = LengthDelimited(tag) && (field == kIdField || field == kHealthField ||
                                                (with_topology && field == kTopologyField));
    if (!known) {
      if (!SkipField(tag, &q, end, 0)) {
        return absl::InvalidArgumentError("a field cut short or of an unknown type");
      }
      continue;
    }
    uint64_t n = 0;
    if (!ReadSize(&q, end, &n)) {
      return absl::InvalidArgumentError(absl::StrCat("field ", field, " is cut short"));
    }
    const absl::string_view value(q, static_cast<size_t>(n));
    q += n;
    // The last occurrence of a string wins, as protobuf reads it; a message
    // sent twice is merged, which for TopologyInfo (one repeated field) is
    // the concatenation of its parts.
    if (field == kTopologyField) {
      v1beta1::TopologyInfo t;
      if (!t.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
        return absl::InvalidArgumentError("its topology is not a TopologyInfo");
      }
      if (d->has_topology) {
        *merged = absl::StrCat(d->topology, value);
        d->topology = *merged;
      } else {
        d->has_topology = true;
        d->topology = value;
      }
      continue;
    }
    if (!google::protobuf::internal::IsStructurallyValidUTF8(value.data(),
                                                             static_cast<int>(value.size()))) {
      return absl::InvalidArgumentError(field == kIdField ? "its ID is not UTF-8"
                                                          : "its health is not UTF-8");
    }
    (field == kIdField ? d->id : d->health) = value;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const DeviceList>> DeviceList::FromWire(absl::string_view wire,
                                                                       bool with_topology) {
  constexpr absl::string_view kNot = "not a ListAndWatchResponse: ";
  Builder out(0, wire.size());
  const char* p = wire.data();
  const char* end = p + wire.size();
  int index = 0;
  while (p < end) {
    uint64_t tag = 0;
    if (!ReadTag(&p, end, &tag)) {
      return absl::InvalidArgumentError(absl::StrCat(kNot, "a malformed field tag"));
    }
    if ((tag >> 3) != static_cast<uint64_t>(kDevicesField) || !LengthDelimited(tag)) {
      if (!SkipField(tag, &p, end, 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat(kNot, "a field cut short or of an unknown wire type"));
      }
      continue;
    }
    uint64_t len = 0;
    if (!ReadSize(&p, end, &len)) {
      return absl::InvalidArgumentError(absl::StrCat(kNot, "device ", index, ": cut short"));
    }
    View d;
    std::string merged;  // a topology sent in parts
    if (absl::Status s = ReadDevice(absl::string_view(p, len), with_topology, &d, &merged);
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(kNot, "device ", index, ": ", s.message()));
    }
    p += len;
    out.Add(d);
    ++index;
  }
  return std::move(out).Build();
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
  Builder out(starts_.size(), wire_.size() + starts_.size() * 4);
  for (int i = 0; i < size(); ++i) {
    View v = device(i);
    if (!changed[static_cast<size_t>(i)].empty()) v.health = changed[static_cast<size_t>(i)];
    out.Add(v);
  }
  return std::move(out).Build();
}

}  // namespace dpproxy
