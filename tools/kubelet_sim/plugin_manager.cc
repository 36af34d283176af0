#include "tools/kubelet_sim/plugin_manager.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/pluginregistration/api.grpc.pb.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"

namespace dpproxy::sim {
namespace {

// Identity of a socket file: device, inode and change time (a socket
// removed and created again often gets its inode number back; the kubelet
// sees the deletion and the creation as fsnotify events).
std::string InodeKey(const std::string& path) {
  std::optional<FileId> id = StatFileId(path);
  if (!id.has_value()) return "";
  return absl::StrCat(id->dev, ":", id->ino, ":", id->ctime_ns);
}

}  // namespace

PluginManager::PluginManager(std::string dir, absl::Duration dial_timeout, EventLog* events)
    : dir_(std::move(dir)), dial_timeout_(dial_timeout), events_(events) {}

PluginManager::~PluginManager() { Stop(); }

absl::Status PluginManager::Start(HandlerFor handlers) {
  Stop();
  {
    absl::MutexLock lock(&mu_);
    handlers_ = std::move(handlers);
  }
  watcher_ = std::make_unique<DirWatcher>(dir_, [this](const DirWatcher::Event& e) {
    if (e.kind != DirWatcher::Event::kDeleted) return;
    const std::string path = JoinPath(dir_, e.name);
    {
      absl::MutexLock lock(&deleted_mu_);
      deleted_.insert(path);
    }
    events_->Emit("watcher_socket_deleted", {{"socket", path}});
  });
  if (absl::Status s = watcher_->Start(); !s.ok()) {
    watcher_.reset();
    return s;
  }
  stopping_ = false;
  return absl::OkStatus();
}

void PluginManager::Stop() {
  stopping_ = true;
  if (watcher_) {
    watcher_->Stop();
    watcher_.reset();
  }
  absl::MutexLock lock(&mu_);
  handlers_ = nullptr;
  watched_.clear();
  absl::MutexLock deleted_lock(&deleted_mu_);
  deleted_.clear();
}

void PluginManager::Reconcile() {
  absl::MutexLock lock(&mu_);
  if (stopping_ || handlers_ == nullptr) return;
  const std::vector<std::string> present = ListSockets(dir_);
  std::set<std::string> deleted;
  {
    absl::MutexLock deleted_lock(&deleted_mu_);
    deleted.swap(deleted_);
  }
  for (auto it = watched_.begin(); it != watched_.end();) {
    const std::string& path = it->first;
    const bool listed = std::find(present.begin(), present.end(), path) != present.end();
    // Kept if unchanged, or gone without a deletion (renamed away, or its
    // event not read yet): nothing the kubelet acts on.
    const bool kept = listed ? InodeKey(path) == it->second.inode_key : deleted.count(path) == 0;
    if (kept) {
      ++it;
      continue;
    }
    if (it->second.registered) {
      if (Handler* h = handlers_(it->second.type); h != nullptr) {
        h->DeregisterPlugin(it->second.name, path);
      }
    }
    it = watched_.erase(it);
  }
  for (const std::string& path : present) {
    if (stopping_) return;
    if (watched_.count(path) == 0) RegisterSocket(path);
  }
}

void PluginManager::RegisterSocket(const std::string& socket_path) {
  Watched& watched = watched_[socket_path];
  watched.inode_key = InodeKey(socket_path);
  events_->Emit("watcher_found", {{"socket", socket_path}});
  auto channel = MakeUnixChannel(socket_path);
  auto stub = pluginregistration::Registration::NewStub(channel);
  auto failed = [&](const std::string& error) {
    events_->Emit("watcher_registration_failed", {{"socket", socket_path}, {"error", error}});
  };
  // Dialled in short slices, so that a stopping kubelet ends the wait.
  absl::Status dialled = absl::DeadlineExceededError("context deadline exceeded");
  for (absl::Time deadline = absl::Now() + dial_timeout_; absl::Now() < deadline;) {
    if (stopping_) return;
    if (WaitForConnected(channel.get(), std::min(absl::Milliseconds(200), deadline - absl::Now()))
            .ok()) {
      dialled = absl::OkStatus();
      break;
    }
  }
  if (!dialled.ok()) {
    return failed(absl::StrCat("failed to dial socket ", socket_path, ", err: ",
                               dialled.message()));
  }
  pluginregistration::PluginInfo info;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    grpc::Status st = stub->GetInfo(&ctx, pluginregistration::InfoRequest(), &info);
    if (!st.ok()) {
      return failed(absl::StrCat("failed to get plugin info using RPC GetInfo at socket ",
                                 socket_path, ", err: ", GoRpcError(st)));
    }
  }
  watched.name = info.name();
  watched.type = info.type();
  std::string error;
  if (Handler* h = handlers_(info.type()); h != nullptr) {
    error = h->RegisterPlugin(info, socket_path);
  } else {
    error = absl::StrCat("no handler registered for plugin type: ", info.type(), " at socket ",
                         socket_path);
    events_->Emit("registration_rejected", {{"resource", info.name()},
                                           {"socket", socket_path},
                                           {"via", "plugin-watcher"},
                                           {"error", error}});
  }
  watched.registered = error.empty();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  pluginregistration::RegistrationStatus status;
  status.set_plugin_registered(error.empty());
  status.set_error(error);
  pluginregistration::RegistrationStatusResponse resp;
  stub->NotifyRegistrationStatus(&ctx, status, &resp);
}

}  // namespace dpproxy::sim
