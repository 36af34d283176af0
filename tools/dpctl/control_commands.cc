#include "tools/dpctl/control_commands.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <iostream>

#include <grpcpp/client_context.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "proxy/control/control.grpc.pb.h"
#include "proxy/control/control_server.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"

namespace dpproxy {
namespace {

namespace pb = ::dpproxy::control::v1;

constexpr absl::Duration kCallTimeout = absl::Seconds(10);

// Why the control socket cannot be used by this process, or "" if a
// connection is accepted: a missing socket and a refused permission are
// named here, where gRPC would say only "unavailable".
std::string CannotConnect(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == EACCES) {
      return absl::StrCat("permission denied on ", path,
                          ": only root or the user dpproxy runs as may use it (its state "
                          "directory is theirs alone); this is uid ",
                          ::geteuid());
    }
    return absl::StrCat("no dpproxy control socket at ", path,
                        ": is dpproxy running, with --state_dir=", DirName(path), "?");
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::StrCat("socket: ", ErrnoText(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  ::close(fd);
  if (rc == 0) return "";
  if (err == EACCES || err == EPERM) {
    return absl::StrCat("permission denied on ", path, ": only root or the user dpproxy runs as (",
                        "uid ", st.st_uid, ", the socket's owner) may use it; this is uid ",
                        ::geteuid());
  }
  if (err == ECONNREFUSED) {
    return absl::StrCat("nothing serves ", path, ": is dpproxy running?");
  }
  return absl::StrCat("cannot connect to ", path, ": ", ErrnoText(err));
}

std::string Describe(const grpc::Status& s, const std::string& path) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::StrCat(
        "dpproxy at ", path, " did not answer (", s.error_message(),
        "); it closes connections from users other than its own and root, and stops "
        "serving this socket while it hands over to a new dpproxy");
  }
  return s.error_message();
}

nlohmann::json JsonOf(const pb::CordonEntry& e) {
  return {{"resource", e.resource()},   {"device", e.device()},
          {"reason", e.reason()},       {"since_unix_ms", e.since_unix_ms()},
          {"by_uid", e.by_uid()},       {"by_pid", e.by_pid()}};
}

std::string When(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms),
                          absl::LocalTimeZone());
}

}  // namespace

bool IsControlCommand(const std::string& command) {
  return command == "cordon" || command == "uncordon" || command == "cordons";
}

int RunControlCommand(const std::string& command, const std::vector<std::string>& args,
                      const std::string& state_dir, const std::string& reason,
                      const std::string& output) {
  const size_t wanted = command == "cordons" ? 0 : 2;
  if (args.size() != wanted) {
    std::cerr << "dpctl " << command << ": "
              << (wanted == 0 ? "takes no arguments"
                              : "needs a RESOURCE and a DEVICE (the ID the kubelet sees)")
              << "; see dpctl --help\n";
    return 2;
  }
  if (command == "cordon") {
    if (reason.empty()) {
      std::cerr << "dpctl cordon: give a --reason; it is shown in dpproxy status, its events "
                   "and its log\n";
      return 2;
    }
    if (absl::Status s = CheckCordonReason(reason); !s.ok()) {
      std::cerr << "dpctl cordon: " << s.message() << "\n";
      return 2;
    }
  }
  if (output != "table" && output != "json") {
    std::cerr << "dpctl: --output=" << output << " is not table or json\n";
    return 2;
  }
  const std::string path = JoinPath(state_dir, kControlSocketName);
  if (std::string why = CannotConnect(path); !why.empty()) {
    std::cerr << "dpctl " << command << ": " << why << "\n";
    return 1;
  }
  auto stub = pb::Control::NewStub(MakeUnixChannel(path));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  if (command == "cordons") {
    pb::ListCordonsReply reply;
    grpc::Status s = stub->ListCordons(&ctx, pb::ListCordonsRequest(), &reply);
    if (!s.ok()) {
      std::cerr << "dpctl cordons: " << Describe(s, path) << "\n";
      return 1;
    }
    if (output == "json") {
      nlohmann::json list = nlohmann::json::array();
      for (const pb::CordonEntry& e : reply.cordons()) list.push_back(JsonOf(e));
      std::cout << nlohmann::json{{"cordons", list}}.dump(2) << "\n";
      return 0;
    }
    if (reply.cordons().empty()) {
      std::cout << "no device is cordoned\n";
      return 0;
    }
    std::cout << absl::StrFormat("%-28s %-24s %-19s %-8s %s\n", "RESOURCE", "DEVICE", "SINCE",
                                 "BY UID", "REASON");
    for (const pb::CordonEntry& e : reply.cordons()) {
      std::cout << absl::StrFormat("%-28s %-24s %-19s %-8d %s\n", e.resource(), e.device(),
                                   When(e.since_unix_ms()), e.by_uid(), e.reason());
    }
    return 0;
  }
  pb::CordonReply reply;
  grpc::Status s;
  if (command == "cordon") {
    pb::CordonRequest req;
    req.set_resource(args[0]);
    req.set_device(args[1]);
    req.set_reason(reason);
    s = stub->Cordon(&ctx, req, &reply);
  } else {
    pb::UncordonRequest req;
    req.set_resource(args[0]);
    req.set_device(args[1]);
    s = stub->Uncordon(&ctx, req, &reply);
  }
  if (!s.ok()) {
    std::cerr << "dpctl " << command << ": " << Describe(s, path) << "\n";
    return 1;
  }
  if (output == "json") {
    std::cout << JsonOf(reply.cordon()).dump(2) << "\n";
  } else if (command == "cordon") {
    std::cout << reply.cordon().resource() << " " << reply.cordon().device()
              << " cordoned: the kubelet is shown it Unhealthy until dpctl uncordon "
              << reply.cordon().resource() << " " << reply.cordon().device() << "\n";
  } else {
    std::cout << reply.cordon().resource() << " " << reply.cordon().device()
              << " uncordoned (it was cordoned since " << When(reply.cordon().since_unix_ms())
              << ": " << reply.cordon().reason() << ")\n";
  }
  return 0;
}

}  // namespace dpproxy
