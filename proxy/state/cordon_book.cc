#include "proxy/state/cordon_book.h"

#include <errno.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "proxy/util/files.h"
#include "proxy/util/status_macros.h"

namespace dpproxy {
namespace {

using Json = nlohmann::json;

constexpr int kFormat = 1;
// Thousands of devices, each with a reason of up to 1 KiB, fit many times.
constexpr size_t kMaxFileBytes = 64 << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<CordonBook>> CordonBook::Open(const std::string& path) {
  std::unique_ptr<CordonBook> book(new CordonBook(path));
  absl::StatusOr<std::string> text = ReadFileUpTo(path, kMaxFileBytes);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) return book;
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read the cordons in ", path, ": ", text.status().message()));
  }
  const auto bad = [&path](const std::string& what) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the cordons in ", path, " cannot be read (", what,
        "); dpproxy will not start without knowing which devices are out of service: "
        "repair the file, or remove it to put every device back in service"));
  };
  const Json j = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (j.value("format", 0) != kFormat) {
    return bad(absl::StrCat("format ", j.value("format", 0), ", this dpproxy reads ", kFormat));
  }
  const Json list = j.value("cordons", Json::array());
  if (!list.is_array()) return bad("\"cordons\" is not a list");
  absl::MutexLock lock(&book->mu_);
  try {
  for (const Json& e : list) {
    if (!e.is_object() || !e.contains("resource") || !e["resource"].is_string() ||
        !e.contains("device") || !e["device"].is_string()) {
      return bad("an entry without a resource and a device");
    }
    Cordon c;
    c.resource = e["resource"].get<std::string>();
    c.device = e["device"].get<std::string>();
    c.reason = e.value("reason", "");
    c.since = absl::FromUnixMillis(e.value("since_unix_ms", int64_t{0}));
    c.by_uid = e.value("by_uid", uid_t{0});
    c.by_pid = e.value("by_pid", int64_t{0});
    book->cordons_[{c.resource, c.device}] = std::move(c);
  }
  } catch (const Json::exception& e) {
    return bad(e.what());
  }
  return book;
}

absl::Status CordonBook::Reload() {
  DPP_ASSIGN_OR_RETURN(std::unique_ptr<CordonBook> read, Open(path_));
  std::map<Key, Cordon> cordons;
  {
    absl::MutexLock lock(&read->mu_);
    cordons = std::move(read->cordons_);
  }
  absl::MutexLock lock(&mu_);
  cordons_ = std::move(cordons);
  ++version_;
  return absl::OkStatus();
}

absl::Status CordonBook::WriteLocked(const std::map<Key, Cordon>& cordons) {
  Json list = Json::array();
  for (const auto& [key, c] : cordons) {
    list.push_back({{"resource", c.resource},
                    {"device", c.device},
                    {"reason", c.reason},
                    {"since_unix_ms", absl::ToUnixMillis(c.since)},
                    {"by_uid", c.by_uid},
                    {"by_pid", c.by_pid}});
  }
  const Json j = {{"format", kFormat}, {"cordons", std::move(list)}};
  if (absl::Status s = WriteFileAtomic(path_, j.dump(2) + "\n", 0600); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cannot write the cordons to ", path_, ": ",
                                               s.message()));
  }
  return absl::OkStatus();
}

absl::Status CordonBook::Set(const Cordon& c) {
  absl::MutexLock lock(&mu_);
  std::map<Key, Cordon> next = cordons_;
  next[{c.resource, c.device}] = c;
  if (absl::Status s = WriteLocked(next); !s.ok()) return s;
  cordons_ = std::move(next);
  ++version_;
  return absl::OkStatus();
}

absl::StatusOr<Cordon> CordonBook::Remove(const std::string& resource, const std::string& device) {
  absl::MutexLock lock(&mu_);
  auto it = cordons_.find({resource, device});
  if (it == cordons_.end()) {
    return absl::NotFoundError(
        absl::StrCat("device ", device, " of ", resource, " is not cordoned"));
  }
  std::map<Key, Cordon> next = cordons_;
  next.erase({resource, device});
  if (absl::Status s = WriteLocked(next); !s.ok()) return s;
  Cordon removed = it->second;
  cordons_ = std::move(next);
  ++version_;
  return removed;
}

std::vector<Cordon> CordonBook::List() {
  absl::MutexLock lock(&mu_);
  std::vector<Cordon> out;
  for (const auto& [key, c] : cordons_) out.push_back(c);
  return out;
}

std::map<std::string, std::map<std::string, std::string>> CordonBook::ByResource() {
  absl::MutexLock lock(&mu_);
  std::map<std::string, std::map<std::string, std::string>> out;
  for (const auto& [key, c] : cordons_) out[c.resource][c.device] = c.reason;
  return out;
}

}  // namespace dpproxy
