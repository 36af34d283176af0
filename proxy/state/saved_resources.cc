#include "proxy/state/saved_resources.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <utility>

#include "absl/strings/string_view.h"

namespace dpproxy {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedOutputStream;

// Appends the devices of a ListAndWatchResponse's bytes (field 1, each
// length-delimited) as state::Resource's `devices` (field 4): the same
// entries under another tag, of the same one-byte size. Anything else in
// the bytes is not a device and is left out.
void AppendListAsDevices(absl::string_view wire, std::string* out) {
  constexpr uint8_t kListDevices = (1 << 3) | WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
  constexpr uint8_t kResourceDevices =
      (state::Resource::kDevicesFieldNumber << 3) | WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
  static_assert(state::Resource::kDevicesFieldNumber < 16, "a one-byte tag");
  out->reserve(out->size() + wire.size());
  size_t pos = 0;
  while (pos < wire.size()) {
    const uint8_t tag = static_cast<uint8_t>(wire[pos]);
    uint64_t len = 0;
    size_t at = pos + 1;
    for (int shift = 0; at < wire.size() && shift < 64; shift += 7) {
      const uint8_t b = static_cast<uint8_t>(wire[at++]);
      len |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) break;
    }
    if (tag != kListDevices || len > wire.size() - at) return;  // not a list's bytes
    out->push_back(static_cast<char>(kResourceDevices));
    out->append(wire.data() + pos + 1, at - pos - 1 + len);
    pos = at + len;
  }
}

// The length of a resource's field: its bytes, and its time if set.
size_t FieldLength(size_t encoded, int64_t updated_unix_ms) {
  if (updated_unix_ms == 0) return encoded;
  return encoded +
         WireFormatLite::TagSize(state::Resource::kUpdatedUnixMsFieldNumber,
                                 WireFormatLite::TYPE_INT64) +
         WireFormatLite::Int64Size(updated_unix_ms);
}

}  // namespace

std::string SavedResources::Held::Encoded() const {
  std::string out = bytes;
  if (list_wire != nullptr) AppendListAsDevices(*list_wire, &out);
  return out;
}

bool SavedResources::Same(const std::vector<ToSave>& next) const {
  if (next.size() != held_.size()) return false;
  for (size_t i = 0; i < next.size(); ++i) {
    const ToSave& n = next[i];
    const Held& h = held_[i];
    // The same list's bytes are the same pointer; otherwise (another list,
    // or a resource as loaded from the file, whole) the encodings are
    // compared.
    if (n.list_wire != nullptr && h.list_wire != nullptr) {
      if (n.head != h.bytes || (n.list_wire != h.list_wire && *n.list_wire != *h.list_wire)) {
        return false;
      }
      continue;
    }
    if (Held{n.head, n.list_wire, 0}.Encoded() != h.Encoded()) return false;
  }
  return true;
}

void SavedResources::Adopt(std::vector<ToSave> next) {
  for (size_t i = 0; i < next.size() && i < held_.size(); ++i) {
    if (held_[i].list_wire == next[i].list_wire) continue;
    held_[i].bytes = std::move(next[i].head);
    held_[i].list_wire = std::move(next[i].list_wire);
  }
}

void SavedResources::Replace(std::vector<ToSave> next, int64_t now_ms) {
  held_.clear();
  held_.reserve(next.size());
  for (ToSave& r : next) held_.push_back({std::move(r.head), std::move(r.list_wire), now_ms});
}

void SavedResources::TakeFrom(state::State* from) {
  held_.clear();
  held_.reserve(static_cast<size_t>(from->resources_size()));
  for (state::Resource& r : *from->mutable_resources()) {
    Held saved;
    saved.updated_unix_ms = r.updated_unix_ms();
    r.clear_updated_unix_ms();
    r.SerializeToString(&saved.bytes);
    held_.push_back(std::move(saved));
  }
  from->clear_resources();
}

void SavedResources::AppendTo(state::State* out) const {
  for (const Held& saved : held_) {
    state::Resource* r = out->add_resources();
    r->ParseFromString(saved.Encoded());
    r->set_updated_unix_ms(saved.updated_unix_ms);
  }
}

SavedResources::Fields SavedResources::EncodeFields() const {
  Fields f;
  f.encoded.reserve(held_.size());
  for (const Held& saved : held_) {
    f.encoded.push_back(saved.Encoded());
    const size_t length = FieldLength(f.encoded.back().size(), saved.updated_unix_ms);
    f.size += WireFormatLite::TagSize(state::State::kResourcesFieldNumber,
                                      WireFormatLite::TYPE_MESSAGE) +
              CodedOutputStream::VarintSize32(static_cast<uint32_t>(length)) + length;
  }
  return f;
}

void SavedResources::AppendFields(const Fields& fields, std::string* out) const {
  for (size_t i = 0; i < held_.size() && i < fields.encoded.size(); ++i) {
    const std::string& encoded = fields.encoded[i];
    const int64_t updated = held_[i].updated_unix_ms;
    const size_t length = FieldLength(encoded.size(), updated);
    uint8_t head[20];  // a tag and a varint32; then a tag and a varint64
    uint8_t* end = WireFormatLite::WriteTagToArray(
        state::State::kResourcesFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED, head);
    end = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(length), end);
    out->append(reinterpret_cast<const char*>(head), static_cast<size_t>(end - head));
    out->append(encoded);
    if (updated != 0) {
      end = WireFormatLite::WriteInt64ToArray(state::Resource::kUpdatedUnixMsFieldNumber, updated,
                                              head);
      out->append(reinterpret_cast<const char*>(head), static_cast<size_t>(end - head));
    }
  }
}

}  // namespace dpproxy
