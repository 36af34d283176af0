// Which sanitizer, if any, this test binary was built with, and what that
// means for deadlines on work done under it.
#ifndef DPPROXY_TESTS_TESTING_SANITIZERS_H_
#define DPPROXY_TESTS_TESTING_SANITIZERS_H_

namespace dpproxy::testing {

#if defined(__has_feature)
#define DPP_TESTING_HAS_FEATURE(x) __has_feature(x)
#else
#define DPP_TESTING_HAS_FEATURE(x) 0
#endif

// gcc says so with __SANITIZE_*__, clang with __has_feature.
#if defined(__SANITIZE_ADDRESS__) || DPP_TESTING_HAS_FEATURE(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#if defined(__SANITIZE_THREAD__) || DPP_TESTING_HAS_FEATURE(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#undef DPP_TESTING_HAS_FEATURE

// A deadline on work the code under test must do (encode and send 4 MB,
// say), as opposed to a deadline on an event that may never come, is
// multiplied by this: instrumented code runs several times slower, and more
// so on a loaded machine.
inline constexpr int kWorkSlowdown = kThreadSanitizer ? 5 : kAddressSanitizer ? 3 : 1;

}  // namespace dpproxy::testing

#endif  // DPPROXY_TESTS_TESTING_SANITIZERS_H_
