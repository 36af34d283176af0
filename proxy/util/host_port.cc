#include "proxy/util/host_port.h"

#include <arpa/inet.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dpproxy {

absl::StatusOr<HostPort> ParseHostPort(const std::string& address) {
  auto bad = [&address](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", address, "\": ", why,
                     " (expected HOST:PORT with an IP address or localhost, e.g. "
                     "127.0.0.1:9464 or [::1]:9464)"));
  };
  HostPort hp;
  std::string port;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return bad("an IPv6 address in brackets must be followed by :PORT");
    }
    hp.host = address.substr(1, close - 1);
    port = address.substr(close + 2);
    unsigned char buf[16];
    if (::inet_pton(AF_INET6, hp.host.c_str(), buf) != 1) return bad("not an IPv6 address");
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) return bad("no port");
    hp.host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (hp.host.empty()) hp.host = "0.0.0.0";
    if (hp.host == "localhost") hp.host = "127.0.0.1";
    unsigned char buf[4];
    if (::inet_pton(AF_INET, hp.host.c_str(), buf) != 1) {
      return bad(hp.host.find(':') != std::string::npos ? "an IPv6 address needs brackets"
                                                          : "not an IP address");
    }
  }
  int n = -1;
  if (port.empty() || !absl::SimpleAtoi(port, &n) || n < 0 || n > 65535 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return bad("the port is not a number from 0 to 65535");
  }
  hp.port = n;
  return hp;
}

}  // namespace dpproxy
