// The YAML configuration parser: any text gives OK or an error naming
// file:line, never a crash or an uncaught exception.
#include <cstdint>
#include <string>

#include "proxy/config/config_file.h"
#include "proxy/server/proxy_server.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dpproxy::ProxyConfig config;
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)dpproxy::LoadConfigText(text, "fuzz.yaml", &config);
  return 0;
}
