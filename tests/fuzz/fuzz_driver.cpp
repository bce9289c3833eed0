// fuzz_driver.cpp — a small stand-in for libFuzzer's main() so fuzz targets also run in
// the default g++ build (and in ctest).
//
// Usage: fuzz_X [options] SEED_FILE_OR_DIR...
//   -iterations=N    mutated inputs to run after the seeds (default 20000)
//   -max_seconds=S   stop mutating after S seconds (default 20)
//   -seed=N          PRNG seed (default 1): runs are deterministic for a given seed/corpus
//   -require=PATH    exit with code 77 (ctest SKIP_RETURN_CODE) when PATH does not exist
// Every seed is run as is, then mutations of the seeds: bit flips, random bytes,
// interesting integers (0, -1, 2^31, 2^62, ...) written over 1/2/4/8 bytes, byte inserts
// and deletes, chunk copies, truncation and splicing of two seeds. A crash fails the run;
// a signal handler writes the input being run to ./fuzz-crash-input so it can be replayed
// (pass that file as the only seed with -iterations=0).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

constexpr size_t kMaxInput = 1 << 20;

bool read_file(const std::filesystem::path& p, std::vector<uint8_t>* out) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return false;
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return true;
}

// The input being run, for the crash handler.
const uint8_t* volatile g_data = nullptr;
volatile size_t g_size = 0;

void on_crash(int sig) {
  const char msg[] = "fuzz driver: crash; input written to ./fuzz-crash-input\n";
  (void)!write(2, msg, sizeof(msg) - 1);
  const int fd = ::open("fuzz-crash-input", O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    (void)!write(fd, g_data, g_size);
    ::close(fd);
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void run_one(const std::vector<uint8_t>& input) {
  g_data = input.data();
  g_size = input.size();
  LLVMFuzzerTestOneInput(input.data(), input.size());
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  uint64_t below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  void mutate(std::vector<uint8_t>& b, const std::vector<std::vector<uint8_t>>& corpus) {
    const int rounds = 1 + static_cast<int>(below(4));
    for (int r = 0; r < rounds; ++r) one(b, corpus);
    if (b.size() > kMaxInput) b.resize(kMaxInput);
  }

 private:
  void one(std::vector<uint8_t>& b, const std::vector<std::vector<uint8_t>>& corpus) {
    switch (below(9)) {
      case 0:  // flip one bit
        if (!b.empty()) b[below(b.size())] ^= static_cast<uint8_t>(1u << below(8));
        break;
      case 1:  // random byte
        if (!b.empty()) b[below(b.size())] = static_cast<uint8_t>(rng_());
        break;
      case 2:
      case 3:
        interesting(b);
        break;
      case 4: {  // insert bytes
        const size_t at = below(b.size() + 1), n = 1 + below(16);
        std::vector<uint8_t> ins(n);
        for (auto& x : ins) x = static_cast<uint8_t>(rng_());
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), ins.begin(), ins.end());
        break;
      }
      case 5: {  // delete a range
        if (b.empty()) break;
        const size_t at = below(b.size()), n = 1 + below(std::min<size_t>(64, b.size() - at));
        b.erase(b.begin() + static_cast<std::ptrdiff_t>(at),
                b.begin() + static_cast<std::ptrdiff_t>(at + n));
        break;
      }
      case 6:  // truncate
        b.resize(below(b.size() + 1));
        break;
      case 7: {  // copy a chunk within the input
        if (b.size() < 2) break;
        const size_t from = below(b.size()), to = below(b.size());
        const size_t n = 1 + below(std::min(b.size() - from, b.size() - to));
        std::memmove(b.data() + to, b.data() + from, n);
        break;
      }
      default: {  // splice: our prefix + another seed's suffix
        const auto& other = corpus[below(corpus.size())];
        const size_t cut = below(b.size() + 1), from = below(other.size() + 1);
        b.resize(cut);
        b.insert(b.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
        break;
      }
    }
  }

  void interesting(std::vector<uint8_t>& b) {
    static const uint64_t kValues[] = {0,
                                       1,
                                       2,
                                       3,
                                       4,
                                       7,
                                       8,
                                       9,
                                       12,
                                       13,
                                       15,
                                       16,
                                       31,
                                       32,
                                       33,
                                       64,
                                       127,
                                       128,
                                       255,
                                       256,
                                       4096,
                                       65535,
                                       65536,
                                       0x7fffffffull,
                                       0x80000000ull,
                                       0xffffffffull,
                                       0x100000000ull,
                                       1ull << 40,
                                       1ull << 62,
                                       1ull << 63,
                                       0x7fffffffffffffffull,
                                       ~0ull,
                                       ~0ull - 31};
    static const size_t kWidths[] = {1, 2, 4, 8};
    const size_t w = kWidths[below(4)];
    if (b.size() < w) return;
    uint64_t v = kValues[below(sizeof(kValues) / sizeof(kValues[0]))];
    if (below(4) == 0) v = ~v + 1;  // negate sometimes
    // Header fields and 8-byte-aligned positions are the most interesting places.
    const size_t at = below(2) ? below(b.size() - w + 1) : below((b.size() - w) / 4 + 1) * 4;
    std::memcpy(b.data() + at, &v, w);
  }

  std::mt19937_64 rng_;
};

}  // namespace

int main(int argc, char** argv) {
  uint64_t iterations = 20000, seed = 1;
  double max_seconds = 20;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("-iterations=", 0) == 0) {
      iterations = std::strtoull(a.c_str() + 12, nullptr, 10);
    } else if (a.rfind("-max_seconds=", 0) == 0) {
      max_seconds = std::strtod(a.c_str() + 13, nullptr);
    } else if (a.rfind("-seed=", 0) == 0) {
      seed = std::strtoull(a.c_str() + 6, nullptr, 10);
    } else if (a.rfind("-require=", 0) == 0) {
      if (!std::filesystem::exists(a.substr(9))) {
        std::printf("fuzz driver: skipping, %s is absent\n", a.c_str() + 9);
        return 77;
      }
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "fuzz driver: unknown option %s\n", a.c_str());
      return 2;
    } else {
      inputs.push_back(a);
    }
  }
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) std::signal(sig, on_crash);
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);

  std::vector<std::vector<uint8_t>> corpus;
  for (const std::string& in : inputs) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(in)) {
      for (const auto& e : std::filesystem::directory_iterator(in)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());  // deterministic order
    } else {
      files.push_back(in);
    }
    for (const auto& p : files) {
      std::vector<uint8_t> b;
      if (!read_file(p, &b)) {
        std::fprintf(stderr, "fuzz driver: cannot read %s\n", p.c_str());
        return 2;
      }
      if (b.size() > kMaxInput) b.resize(kMaxInput);
      corpus.push_back(std::move(b));
    }
  }
  if (corpus.empty()) corpus.push_back({});
  for (const auto& b : corpus) run_one(b);

  Mutator m(seed);
  const auto start = std::chrono::steady_clock::now();
  uint64_t done = 0;
  std::vector<uint8_t> cur;
  for (; done < iterations; ++done) {
    if ((done & 255) == 0) {
      const std::chrono::duration<double> el = std::chrono::steady_clock::now() - start;
      if (el.count() > max_seconds) break;
    }
    cur = corpus[m.below(corpus.size())];
    m.mutate(cur, corpus);
    run_one(cur);
  }
  const std::chrono::duration<double> el = std::chrono::steady_clock::now() - start;
  std::printf("fuzz driver: %zu seeds, %llu mutated inputs in %.2f s, no crash\n", corpus.size(),
              static_cast<unsigned long long>(done), el.count());
  return 0;
}
