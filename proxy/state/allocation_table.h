// The allocations a StateKeeper holds, each as its state::Allocation's
// encoding, in id order.
//
// A parsed state::Allocation costs some 650 bytes of heap (the message and
// a string object, often with a block of its own, for each of its fields);
// its encoding costs what its fields' bytes do. Allocations are written to
// the state file whole, looked up by id, and read field by field only by
// the passes that name or release them, so they are kept encoded and parsed
// when read: a snapshot is their bytes laid end to end.
//
// The encodings live end to end in large blocks of the table's own, not in
// a heap block each. Held for as long as their pods run, a heap block per
// allocation would sit among the short-lived blocks of every call (gRPC's
// buffers, messages, the journal's records), and the holes between them
// make every later malloc and free dearer. A changed or removed allocation
// leaves its old bytes behind; once those fill a block and outweigh half of
// what is held, the held bytes are copied into fresh blocks and the old
// ones freed.
#ifndef DPPROXY_PROXY_STATE_ALLOCATION_TABLE_H_
#define DPPROXY_PROXY_STATE_ALLOCATION_TABLE_H_

#include <stddef.h>
#include <stdint.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "proxy/state/state.pb.h"

namespace dpproxy {

class AllocationTable {
 public:
  AllocationTable() = default;
  AllocationTable(AllocationTable&& other) noexcept { *this = std::move(other); }
  AllocationTable& operator=(AllocationTable&& other) noexcept;
  AllocationTable(const AllocationTable&) = delete;
  AllocationTable& operator=(const AllocationTable&) = delete;

  size_t size() const { return by_id_.size(); }
  bool empty() const { return by_id_.empty(); }
  void clear();

  // Adds `a`, or replaces the allocation with its id.
  void Put(const state::Allocation& a);
  // Adds or replaces allocation `id` with `wire`, the encoding of an
  // allocation with that id made by this process (a journal record's).
  void PutOwnEncoding(uint64_t id, absl::string_view wire) { Place(id, wire, {}); }
  // Appends `fields`, encoded fields of state::Allocation, to allocation
  // `id`'s encoding: read back, each replaces the field it names (a message
  // field merges). False if there is no allocation `id`.
  bool AppendFields(uint64_t id, absl::string_view fields);
  // Adds an allocation from its encoding, as a state file holds it; false
  // if it does not parse. One whose id is held already is kept aside for
  // RenumberDuplicates, never dropped nor put in the other's place.
  bool PutEncoded(absl::string_view wire);
  // Gives each allocation kept aside by PutEncoded or TakeFrom a fresh id
  // (above `*last_id` and every held one; `*last_id` is advanced) and adds
  // it. Returns how many.
  int RenumberDuplicates(uint64_t* last_id);
  // The highest id held; 0 if none.
  uint64_t max_id() const { return by_id_.empty() ? 0 : by_id_.rbegin()->first; }
  // Whether an allocation has `id`; with `out`, parsed into it.
  bool Get(uint64_t id, state::Allocation* out = nullptr) const;
  // Parses the allocation with `id`, lets `change` edit it (its id stays)
  // and keeps the result. False if there is none.
  bool Update(uint64_t id, absl::FunctionRef<void(state::Allocation*)> change);
  // Removes the allocation with `id`; with `removed`, parsed into it first.
  // False if there is none.
  bool Erase(uint64_t id, state::Allocation* removed = nullptr);
  // Removes the allocations with ids in [first, last), oldest first, and
  // returns them parsed.
  std::vector<state::Allocation> EraseRange(uint64_t first, uint64_t last);

  // Calls `visit` with each allocation, oldest (lowest id) first, parsed
  // into one message reused from call to call.
  void ForEach(absl::FunctionRef<void(const state::Allocation&)> visit) const;

  // Calls `visit` with each allocation's id and encoding, oldest first: for
  // a caller that parses into messages of its own, or reads a few fields.
  // The bytes stay valid until the table next changes.
  void ForEachEncoded(absl::FunctionRef<void(uint64_t, absl::string_view)> visit) const {
    for (const auto& [id, slot] : by_id_) visit(id, slot.view());
  }

  // Moves every allocation of `from` into the table (and out of `from`); a
  // repeated id is kept aside as in PutEncoded.
  void TakeFrom(state::State* from);
  // Appends each allocation, parsed, to `to`'s allocations.
  void CopyTo(state::State* to) const;
  // Appends each allocation as an `allocations` entry of a state::State's
  // encoding: what State::SerializeToString would write for them. A caller
  // writing a large state reserves StateFieldSize() more bytes first.
  void AppendAsStateField(std::string* out) const;
  // How many bytes AppendAsStateField appends.
  size_t StateFieldSize() const;

  // The bytes of the held allocations' encodings, and the bytes the blocks
  // hold in all (those and the ones left behind; not the room still free).
  size_t held_bytes() const { return live_; }
  size_t stored_bytes() const { return live_ + dead_; }
  // Blocks are this large; an encoding of more than a quarter of it gets a
  // block of its own size.
  static constexpr size_t kBlockSize = 256 * 1024;

 private:
  struct Slot {
    const char* data;
    size_t size;
    absl::string_view view() const { return {data, size}; }
  };
  // Holds `head` and then `tail` end to end as allocation `id`'s encoding,
  // in place of the one it had.
  void Place(uint64_t id, absl::string_view head, absl::string_view tail);
  // The same with `a`'s encoding, written straight into its room.
  void PlaceMessage(const state::Allocation& a);
  // Holds `slot`, filled, as allocation `id`'s, in place of the one it had.
  void Hold(uint64_t id, Slot slot);
  // Room for `n` bytes in the blocks.
  char* Room(size_t n);
  // Counts a slot's bytes as left behind, and copies what is held into
  // fresh blocks once those fill a block and are half of it or more.
  void Leave(const Slot& s);
  void CompactIfDue();

  absl::btree_map<uint64_t, Slot> by_id_;
  std::vector<std::unique_ptr<char[]>> blocks_;
  char* free_ = nullptr;  // the free room at the end of the last block
  size_t room_ = 0;
  size_t live_ = 0;  // bytes of the held encodings
  size_t dead_ = 0;  // bytes left behind in the blocks
  std::vector<std::string> duplicates_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATE_ALLOCATION_TABLE_H_
