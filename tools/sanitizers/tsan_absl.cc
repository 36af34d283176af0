// tsan_absl.cc: makes Debian's (uninstrumented) absl::Mutex, CondVar and
// Notification visible to ThreadSanitizer. Linked into every binary of a
// `--config=tsan` build, and only there.
//
// Debian's Abseil is compiled without -fsanitize=thread, so TSan cannot see
// that absl::Mutex orders memory: every field guarded by one looks racy.
// The executable defines the synchronisation entry points itself; the
// dynamic linker binds every caller to these definitions (the executable
// comes first in symbol lookup, also for gRPC's own calls), and each one
// calls the library's real function (found with dlsym(RTLD_NEXT)) and tells
// TSan what it did, as happens-before edges:
//   - a lock (exclusive or shared, also on return from Await/LockWhen and
//     CondVar waits) acquires the mutex's address;
//   - an unlock (also on entry to Await and CondVar waits, which let go of
//     the mutex) releases it;
//   - a Condition is evaluated between an acquire and a release, since
//     absl evaluates it under the mutex, on whichever thread holds it;
//   - Notify releases the notification; the waits and HasBeenNotified's
//     inlined atomic load acquire it.
// TSan's lock-order (deadlock) checks do not see these mutexes, and absl's
// own deadlock detector is switched off (its graph is guarded by a lock TSan
// cannot see); races on data these mutexes guard are reported exactly.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

extern "C" {
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
}

namespace {

template <typename Fn>
Fn Real(const char* mangled) {
  void* f = dlsym(RTLD_NEXT, mangled);
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_absl: %s not found in the loaded Abseil\n", mangled);
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

#define DPP_REAL(type, mangled)                         \
  static const auto real = Real<type>(mangled)

void Acquire(const void* a) { __tsan_acquire(const_cast<void*>(a)); }
void Release(const void* a) { __tsan_release(const_cast<void*>(a)); }

// A Condition evaluated as a critical section of the mutex it is evaluated
// under: absl evaluates it holding the mutex, on any thread (often the one
// unlocking, inside the library where no annotation is seen), so the
// evaluation acquires the mutex first and releases it after, publishing
// its reads to the next holder (including the waiter, whose stack holds
// this struct).
struct Annotated {
  const absl::Condition* cond;
  const absl::Mutex* mu;
  static bool Eval(Annotated* a) {
    Acquire(a->mu);
    const bool r = a->cond->Eval();
    Release(a->mu);
    return r;
  }
};

// The address HasBeenNotified() loads (the atomic after the mutex).
const void* NotifiedFlag(const absl::Notification* n) {
  static_assert(sizeof(absl::Notification) >= sizeof(absl::Mutex) + 1, "layout changed");
  return reinterpret_cast<const char*>(n) + sizeof(absl::Mutex);
}

// absl's deadlock detector keeps a global graph under its own (unseen)
// spinlock: TSan would report every update of it. TSan's own lock-order
// checks do not see these mutexes either; deadlocks are left to the tests'
// deadlines in this mode.
const bool kNoDeadlockGraph = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  DPP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  real(this);
  Acquire(this);
}

void Mutex::Unlock() {
  DPP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  Release(this);
  real(this);
}

void Mutex::ReaderLock() {
  DPP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  Acquire(this);
}

void Mutex::ReaderUnlock() {
  DPP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Release(this);
  real(this);
}

bool Mutex::TryLock() {
  DPP_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

void Mutex::Await(const Condition& cond) {
  DPP_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  Annotated a{&cond, this};
  Release(this);
  real(this, Condition(&Annotated::Eval, &a));
  Acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  DPP_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
           "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Annotated a{&cond, this};
  Release(this);
  const bool r = real(this, Condition(&Annotated::Eval, &a), timeout);
  Acquire(this);
  return r;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  DPP_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
           "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Annotated a{&cond, this};
  Release(this);
  const bool r = real(this, Condition(&Annotated::Eval, &a), deadline);
  Acquire(this);
  return r;
}

void Mutex::LockWhen(const Condition& cond) {
  DPP_REAL(void (*)(Mutex*, const Condition&),
           "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  Annotated a{&cond, this};
  real(this, Condition(&Annotated::Eval, &a));
  Acquire(this);
}

void CondVar::Wait(Mutex* mu) {
  DPP_REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  Release(mu);
  real(this, mu);
  Acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  DPP_REAL(bool (*)(CondVar*, Mutex*, absl::Duration),
           "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(mu);
  const bool r = real(this, mu, timeout);
  Acquire(mu);
  return r;
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  DPP_REAL(bool (*)(CondVar*, Mutex*, absl::Time),
           "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(mu);
  const bool r = real(this, mu, deadline);
  Acquire(mu);
  return r;
}

void Notification::Notify() {
  DPP_REAL(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv");
  Release(this);
  Release(NotifiedFlag(this));
  real(this);
}

void Notification::WaitForNotification() const {
  DPP_REAL(void (*)(const Notification*),
           "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  Acquire(this);
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  DPP_REAL(bool (*)(const Notification*, absl::Duration),
           "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool r = real(this, timeout);
  if (r) Acquire(this);
  return r;
}

ABSL_NAMESPACE_END
}  // namespace absl
