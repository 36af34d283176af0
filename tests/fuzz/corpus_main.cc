// main() for the *_corpus_test targets: feeds every file named on the
// command line to LLVMFuzzerTestOneInput once, so the seed corpus is a
// regression test under the normal compiler. Exits non-zero if a file
// cannot be read or no file was given; a crash is a failed test.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  int inputs = 0;
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::cerr << "corpus_main: cannot read " << argv[i] << "\n";
      return 1;
    }
    std::stringstream buf;
    buf << in.rdbuf();
    const std::string bytes = buf.str();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ++inputs;
  }
  if (inputs == 0) {
    std::cerr << "corpus_main: no corpus files given\n";
    return 1;
  }
  std::cout << inputs << " corpus input(s) replayed\n";
  return 0;
}
