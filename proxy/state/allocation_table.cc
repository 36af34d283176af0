#include "proxy/state/allocation_table.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <glog/logging.h>

#include <algorithm>
#include <utility>

namespace dpproxy {

namespace {

// Only bytes the table encoded itself are ever parsed: a failure is a
// defect, said loudly, and the message is left as far as it was read.
void ParseInto(uint64_t id, const std::string& wire, state::Allocation* out) {
  if (!out->ParseFromString(wire)) {
    LOG(DFATAL) << "allocation " << id << " held in memory does not parse (" << wire.size()
                << " bytes)";
  }
}

}  // namespace

void AllocationTable::Put(const state::Allocation& a) {
  a.SerializeToString(&by_id_[a.id()]);
}

bool AllocationTable::PutEncoded(absl::string_view wire) {
  // Only the id is needed, but the whole of it is checked.
  state::Allocation a;
  if (!a.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) return false;
  if (!by_id_.try_emplace(a.id(), wire).second) duplicates_.emplace_back(wire);
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
  if (out != nullptr) ParseInto(id, it->second, out);
  return true;
}

bool AllocationTable::Update(uint64_t id, absl::FunctionRef<void(state::Allocation*)> change) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  state::Allocation a;
  ParseInto(id, it->second, &a);
  change(&a);
  a.set_id(id);
  a.SerializeToString(&it->second);
  // A shorter encoding keeps the longer one's block otherwise.
  if (it->second.capacity() > it->second.size() + 32) it->second.shrink_to_fit();
  return true;
}

bool AllocationTable::AppendFields(uint64_t id, absl::string_view fields) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  std::string& wire = it->second;
  // One block of the final size, not a doubled one.
  std::string grown;
  grown.reserve(wire.size() + fields.size());
  grown.append(wire).append(fields.data(), fields.size());
  wire.swap(grown);
  return true;
}

bool AllocationTable::Erase(uint64_t id, state::Allocation* removed) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  if (removed != nullptr) ParseInto(id, it->second, removed);
  by_id_.erase(it);
  return true;
}

std::vector<state::Allocation> AllocationTable::EraseRange(uint64_t first, uint64_t last) {
  std::vector<state::Allocation> out;
  if (first >= last) return out;
  auto from = by_id_.lower_bound(first);
  auto to = by_id_.lower_bound(last);
  for (auto it = from; it != to; ++it) {
    out.emplace_back();
    ParseInto(it->first, it->second, &out.back());
  }
  by_id_.erase(from, to);
  return out;
}

void AllocationTable::ForEach(absl::FunctionRef<void(const state::Allocation&)> visit) const {
  state::Allocation a;
  for (const auto& [id, wire] : by_id_) {
    ParseInto(id, wire, &a);
    visit(a);
  }
}

void AllocationTable::TakeFrom(state::State* from) {
  for (const state::Allocation& a : from->allocations()) {
    std::string wire = a.SerializeAsString();
    // try_emplace leaves `wire` as it was when the id is held already.
    if (!by_id_.try_emplace(a.id(), std::move(wire)).second) {
      duplicates_.push_back(std::move(wire));
    }
  }
  from->clear_allocations();
}

void AllocationTable::CopyTo(state::State* to) const {
  to->mutable_allocations()->Reserve(to->allocations_size() + static_cast<int>(size()));
  for (const auto& [id, wire] : by_id_) ParseInto(id, wire, to->add_allocations());
}

namespace {
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedOutputStream;
constexpr uint32_t kAllocationsTag = WireFormatLite::MakeTag(
    state::State::kAllocationsFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
}  // namespace

size_t AllocationTable::StateFieldSize() const {
  size_t total = 0;
  for (const auto& [id, wire] : by_id_) {
    total += CodedOutputStream::VarintSize32(kAllocationsTag) +
             CodedOutputStream::VarintSize32(static_cast<uint32_t>(wire.size())) + wire.size();
  }
  return total;
}

void AllocationTable::AppendAsStateField(std::string* out) const {
  uint8_t head[10];  // two varint32s, 5 bytes at most each
  for (const auto& [id, wire] : by_id_) {
    uint8_t* end = CodedOutputStream::WriteVarint32ToArray(kAllocationsTag, head);
    end = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(wire.size()), end);
    out->append(reinterpret_cast<const char*>(head), static_cast<size_t>(end - head));
    out->append(wire);
  }
}

}  // namespace dpproxy
