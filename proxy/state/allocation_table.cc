#include "proxy/state/allocation_table.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace dpproxy {

namespace {

// Only bytes the table encoded itself are ever parsed: a failure is a
// defect, said loudly, and the message is left as far as it was read.
void ParseInto(uint64_t id, absl::string_view wire, state::Allocation* out) {
  if (!out->ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
    LOG(DFATAL) << "allocation " << id << " held in memory does not parse (" << wire.size()
                << " bytes)";
  }
}

}  // namespace

AllocationTable& AllocationTable::operator=(AllocationTable&& other) noexcept {
  if (this == &other) return *this;
  by_id_ = std::move(other.by_id_);
  blocks_ = std::move(other.blocks_);
  free_ = other.free_;
  room_ = other.room_;
  live_ = other.live_;
  dead_ = other.dead_;
  duplicates_ = std::move(other.duplicates_);
  other.clear();
  return *this;
}

void AllocationTable::clear() {
  by_id_.clear();
  blocks_.clear();
  free_ = nullptr;
  room_ = 0;
  live_ = 0;
  dead_ = 0;
  duplicates_.clear();
}

char* AllocationTable::Room(size_t n) {
  if (n > kBlockSize / 4) {
    // A block of its own; the one being filled stays the one to fill.
    blocks_.emplace_back(new char[n]);
    return blocks_.back().get();
  }
  if (n > room_) {
    blocks_.emplace_back(new char[kBlockSize]);
    free_ = blocks_.back().get();
    room_ = kBlockSize;
  }
  char* at = free_;
  free_ += n;
  room_ -= n;
  return at;
}

void AllocationTable::Place(uint64_t id, absl::string_view head, absl::string_view tail) {
  const size_t n = head.size() + tail.size();
  char* at = Room(n);
  if (!head.empty()) std::memcpy(at, head.data(), head.size());
  if (!tail.empty()) std::memcpy(at + head.size(), tail.data(), tail.size());
  Hold(id, Slot{at, n});
}

void AllocationTable::PlaceMessage(const state::Allocation& a) {
  const size_t n = a.ByteSizeLong();
  char* at = Room(n);
  a.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(at));
  Hold(a.id(), Slot{at, n});
}

void AllocationTable::Hold(uint64_t id, Slot slot) {
  live_ += slot.size;
  auto [it, added] = by_id_.try_emplace(id, slot);
  if (!added) {
    const Slot was = it->second;
    it->second = slot;
    Leave(was);
  }
}

void AllocationTable::Leave(const Slot& s) {
  live_ -= s.size;
  dead_ += s.size;
  CompactIfDue();
}

void AllocationTable::CompactIfDue() {
  if (dead_ < kBlockSize || dead_ * 2 < live_) return;
  std::vector<std::unique_ptr<char[]>> old;
  old.swap(blocks_);
  free_ = nullptr;
  room_ = 0;
  dead_ = 0;
  for (auto& [id, slot] : by_id_) {
    char* at = Room(slot.size);
    std::memcpy(at, slot.data, slot.size);
    slot.data = at;
  }
}

void AllocationTable::Put(const state::Allocation& a) { PlaceMessage(a); }

bool AllocationTable::PutEncoded(absl::string_view wire) {
  // Only the id is needed, but the whole of it is checked.
  state::Allocation a;
  if (!a.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) return false;
  if (by_id_.count(a.id()) > 0) {
    duplicates_.emplace_back(wire);
  } else {
    Place(a.id(), wire, {});
  }
  return true;
}

int AllocationTable::RenumberDuplicates(uint64_t* last_id) {
  const int n = static_cast<int>(duplicates_.size());
  for (const std::string& wire : duplicates_) {
    state::Allocation a;
    a.ParseFromString(wire);  // parsed once already
    const uint64_t was = a.id();
    a.set_id(*last_id = std::max(*last_id, max_id()) + 1);
    LOG(WARNING) << "two allocations held id " << was << "; the later one is " << a.id()
                 << " from now on";
    Put(a);
  }
  duplicates_.clear();
  return n;
}

bool AllocationTable::Get(uint64_t id, state::Allocation* out) const {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  if (out != nullptr) ParseInto(id, it->second.view(), out);
  return true;
}

bool AllocationTable::Update(uint64_t id, absl::FunctionRef<void(state::Allocation*)> change) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  state::Allocation a;
  ParseInto(id, it->second.view(), &a);
  change(&a);
  a.set_id(id);
  PlaceMessage(a);
  return true;
}

bool AllocationTable::AppendFields(uint64_t id, absl::string_view fields) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  Place(id, it->second.view(), fields);  // the old bytes stay valid until placed
  return true;
}

bool AllocationTable::Erase(uint64_t id, state::Allocation* removed) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  if (removed != nullptr) ParseInto(id, it->second.view(), removed);
  const Slot was = it->second;
  by_id_.erase(it);
  Leave(was);
  return true;
}

std::vector<state::Allocation> AllocationTable::EraseRange(uint64_t first, uint64_t last) {
  std::vector<state::Allocation> out;
  if (first >= last) return out;
  auto from = by_id_.lower_bound(first);
  auto to = by_id_.lower_bound(last);
  size_t left = 0;
  for (auto it = from; it != to; ++it) {
    out.emplace_back();
    ParseInto(it->first, it->second.view(), &out.back());
    left += it->second.size;
  }
  by_id_.erase(from, to);
  if (left > 0) Leave(Slot{nullptr, left});
  return out;
}

void AllocationTable::ForEach(absl::FunctionRef<void(const state::Allocation&)> visit) const {
  state::Allocation a;
  for (const auto& [id, slot] : by_id_) {
    ParseInto(id, slot.view(), &a);
    visit(a);
  }
}

void AllocationTable::TakeFrom(state::State* from) {
  for (const state::Allocation& a : from->allocations()) {
    if (by_id_.count(a.id()) > 0) {
      duplicates_.push_back(a.SerializeAsString());
    } else {
      PlaceMessage(a);
    }
  }
  from->clear_allocations();
}

void AllocationTable::CopyTo(state::State* to) const {
  to->mutable_allocations()->Reserve(to->allocations_size() + static_cast<int>(size()));
  for (const auto& [id, slot] : by_id_) ParseInto(id, slot.view(), to->add_allocations());
}

namespace {
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedOutputStream;
constexpr uint32_t kAllocationsTag = WireFormatLite::MakeTag(
    state::State::kAllocationsFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
}  // namespace

size_t AllocationTable::StateFieldSize() const {
  size_t total = 0;
  for (const auto& [id, slot] : by_id_) {
    total += CodedOutputStream::VarintSize32(kAllocationsTag) +
             CodedOutputStream::VarintSize32(static_cast<uint32_t>(slot.size)) + slot.size;
  }
  return total;
}

void AllocationTable::AppendAsStateField(std::string* out) const {
  uint8_t head[10];  // two varint32s, 5 bytes at most each
  for (const auto& [id, slot] : by_id_) {
    uint8_t* end = CodedOutputStream::WriteVarint32ToArray(kAllocationsTag, head);
    end = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(slot.size), end);
    out->append(reinterpret_cast<const char*>(head), static_cast<size_t>(end - head));
    out->append(slot.data, slot.size);
  }
}

}  // namespace dpproxy
