// File: saved_resources.h
//
// The resources a snapshot saves (each one's name, backend, negotiated
// version and devices), kept the way they are written: a state::Resource
// serialized without its devices and time, and the devices as the bytes of
// a published v1beta1 ListAndWatchResponse, held shared with the publisher
// rather than copied (a device costs some 30 bytes there instead of a
// message's 150). They are only ever written, compared and, at start, read
// back.
//
// No I/O, no lock: its owner (StateKeeper) guards it and writes what
// EncodeFields and AppendFields lay out.
#ifndef DPPROXY_PROXY_STATE_SAVED_RESOURCES_H_
#define DPPROXY_PROXY_STATE_SAVED_RESOURCES_H_

#include <stddef.h>
#include <stdint.h>

#include <memory>
#include <string>
#include <vector>

#include "proxy/state/state.pb.h"

namespace dpproxy {

class SavedResources {
 public:
  // One resource to save, as the saver has it: a state::Resource
  // serialized without devices or updated_unix_ms, and its devices as the
  // bytes of a v1beta1 ListAndWatchResponse (a published device list's;
  // null: none).
  struct ToSave {
    std::string head;
    std::shared_ptr<const std::string> list_wire;
  };

  // Whether `next` (in order of name) says what is held, the times aside.
  bool Same(const std::vector<ToSave>& next) const;
  // `next` says what is held (Same): the published lists' bytes are held
  // from now on instead of the ones held (a start's own copy).
  void Adopt(std::vector<ToSave> next);
  // `next` replaces what is held, changed at `now_ms`.
  void Replace(std::vector<ToSave> next, int64_t now_ms);
  // Takes `from`'s resources (as a snapshot loaded them), leaving it none.
  void TakeFrom(state::State* from);
  // Adds each resource, whole, to `out`.
  void AppendTo(state::State* out) const;

  // The resources as State's `resources` fields (each its bytes, then its
  // time: a field appended to a message's bytes is read as part of it),
  // in two steps so that the caller sizes its buffer first.
  struct Fields {
    std::vector<std::string> encoded;  // each resource, whole, without its time
    size_t size = 0;                   // what AppendFields appends
  };
  Fields EncodeFields() const;
  void AppendFields(const Fields& fields, std::string* out) const;

 private:
  struct Held {
    // A state::Resource without devices and updated_unix_ms.
    std::string bytes;
    std::shared_ptr<const std::string> list_wire;
    int64_t updated_unix_ms = 0;
    // The whole state::Resource without updated_unix_ms.
    std::string Encoded() const;
  };
  std::vector<Held> held_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATE_SAVED_RESOURCES_H_
