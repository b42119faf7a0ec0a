// What the bench drivers share on the host side: the GPU-count probe, the command line, the
// shape lists, medians and the result rows (bench/README.md, "Results": one JSON object per
// line; run.sh's report stamps device, gpus, commit and date on them).
#pragma once

#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace fusedcomm::bench {

#define FC_BENCH_CUDA(x)                                                                              \
  do {                                                                                                \
    cudaError_t e_ = (x);                                                                             \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#x) + ": " + cudaGetErrorString(e_)); \
  } while (0)

// Visible CUDA GPUs, counted in a child process: a process that forks its ranks must not have
// touched CUDA before (a CUDA context does not survive fork). 0 where there is no driver.
inline int count_gpus_in_child() {
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(std::min(n, 100));
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
  return WEXITSTATUS(status);
}

// "--name value" and "--flag" arguments; usage() is printed for --help and for anything unknown.
class Args {
 public:
  Args(int argc, char** argv, const char* usage) : usage_(usage) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::printf("%s", usage_);
        std::exit(0);
      }
      if (a.rfind("--", 0) != 0) fail("unexpected argument " + a);
      if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        values_[a.substr(2)] = argv[++i];
      } else {
        values_[a.substr(2)] = "";
      }
    }
  }
  std::string str(const std::string& name, const std::string& fallback) {
    seen_.push_back(name);
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }
  double num(const std::string& name, double fallback) {
    seen_.push_back(name);
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    const std::string& v = it->second;
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0') fail("--" + name + " takes a number, not '" + v + "'");
    return d;
  }
  bool flag(const std::string& name) {
    seen_.push_back(name);
    return values_.count(name) > 0;
  }
  // Call after reading every option: an option nobody read is a typo.
  void done() const {
    for (const auto& [k, v] : values_) {
      if (std::find(seen_.begin(), seen_.end(), k) == seen_.end()) fail("unknown option --" + k);
    }
  }
  [[noreturn]] void fail(const std::string& why) const {
    std::fprintf(stderr, "%s\n\n%s", why.c_str(), usage_);
    std::exit(2);
  }

 private:
  const char* usage_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> seen_;
};

// The non-empty lines of a shape list, '#' comments removed, split into words.
inline std::vector<std::vector<std::string>> read_shape_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<std::vector<std::string>> lines;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line.substr(0, line.find('#')));
    std::vector<std::string> words;
    for (std::string w; ss >> w;) words.push_back(w);
    if (!words.empty()) lines.push_back(words);
  }
  return lines;
}

// Explicit shapes from --m/--n/--k values, each a comma list: the i-th M goes with the i-th N
// and K, and a list of one value stands for every i. Throws on a value below 1, a non-number
// or lists of different lengths.
inline std::vector<std::array<int, 3>> explicit_shapes(const std::string& m, const std::string& n,
                                                       const std::string& k) {
  auto parse = [](const std::string& list, const char* what) {
    std::vector<int> v;
    std::istringstream ss(list);
    for (std::string w; std::getline(ss, w, ',');) {
      if (w.empty()) continue;
      char* end = nullptr;
      const long x = std::strtol(w.c_str(), &end, 10);
      if (*end != '\0' || x < 1 || x >= (1l << 31)) {
        throw std::runtime_error(std::string("--") + what + ": '" + w + "' is not a dimension >= 1");
      }
      v.push_back(static_cast<int>(x));
    }
    return v;
  };
  const std::vector<int> ms = parse(m, "m"), ns = parse(n, "n"), ks = parse(k, "k");
  if (ms.empty() && ns.empty() && ks.empty()) return {};
  if (ms.empty() || ns.empty() || ks.empty()) throw std::runtime_error("--m, --n and --k go together");
  const size_t count = std::max({ms.size(), ns.size(), ks.size()});
  for (const auto* v : {&ms, &ns, &ks}) {
    if (v->size() != 1 && v->size() != count) {
      throw std::runtime_error("--m, --n, --k: lists of " + std::to_string(ms.size()) + ", " +
                               std::to_string(ns.size()) + " and " + std::to_string(ks.size()) +
                               " values (each must have one value or the same count)");
    }
  }
  std::vector<std::array<int, 3>> out;
  auto at = [](const std::vector<int>& v, size_t i) { return v.size() == 1 ? v[0] : v[i]; };
  for (size_t i = 0; i < count; ++i) out.push_back({at(ms, i), at(ns, i), at(ks, i)});
  return out;
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One result row, built field by field in the schema's order.
class Row {
 public:
  Row& str(const char* k, const std::string& v) { return raw(k, quote(v)); }
  Row& num(const char* k, double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%.6g", v);
    return raw(k, v == v ? b : "null");  // NaN: null
  }
  Row& integer(const char* k, int64_t v) { return raw(k, std::to_string(v)); }
  Row& boolean(const char* k, bool v) { return raw(k, v ? "true" : "false"); }
  Row& null(const char* k) { return raw(k, "null"); }
  Row& obj(const char* k, const Row& v) { return raw(k, v.json()); }
  Row& nums(const char* k, const std::vector<double>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      char b[64];
      std::snprintf(b, sizeof b, "%s%.6g", i ? ", " : "", v[i]);
      s += b;
    }
    return raw(k, s + "]");
  }
  std::string json() const { return "{" + body_ + "}"; }

 private:
  static std::string quote(const std::string& v) {
    std::string s = "\"";
    for (char c : v) {
      if (c == '"' || c == '\\') s += '\\';
      s += c;
    }
    return s + "\"";
  }
  Row& raw(const char* k, const std::string& v) {
    body_ += (body_.empty() ? "\"" : ", \"") + std::string(k) + "\": " + v;
    return *this;
  }
  std::string body_;
};

// Appends rows to a JSON-lines file (rank 0 of a driver) and echoes a short line to stdout.
class RowWriter {
 public:
  explicit RowWriter(const std::string& path) : f_(path.empty() ? nullptr : std::fopen(path.c_str(), "w")) {
    if (!path.empty() && f_ == nullptr) throw std::runtime_error("cannot write " + path);
  }
  ~RowWriter() {
    if (f_) std::fclose(f_);
  }
  RowWriter(const RowWriter&) = delete;
  RowWriter& operator=(const RowWriter&) = delete;
  void write(const Row& r) {
    if (f_) {
      std::fprintf(f_, "%s\n", r.json().c_str());
      std::fflush(f_);
    }
  }

 private:
  FILE* f_;
};

}  // namespace fusedcomm::bench
