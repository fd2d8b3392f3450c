// hyflash-run: the speculative loop over an export's .pte programs, from the command line.
//
//   hyflash-run EXPORT --prompt-ids 1,2,3 [--max-new-tokens N] [--temperature T] [--top-p P] [--top-k K]
//               [--seed S] [--ignore-eos] [--draft D] [--no-draft] [--width W|rule] [--repeat R] [--threads N]
//               [--pte-kernels K] [--json]
//   hyflash-run EXPORT --conversation [generation options] < turns
//   hyflash-run EXPORT --profile [--contexts 256,1024] [--repeat R] [--threads N] [--write-costs]
//
// Ids in, ids out (the runner has no tokenizer). --json prints what `hyflash generate --json` prints,
// one object per line; --repeat R runs the prompt R times with seeds S, S+1, ... (each run from an
// empty cache), for measurements and distribution checks. --conversation keeps a conversation, as an app does: each
// line of stdin is the whole conversation so far as ids (the earlier turns and replies as the chat template renders
// them, then the new turn), answered as --prompt-ids would be, one output line each, flushed; the ids the runner
// already holds are not prefilled again (turn t samples with seed S + t). --draft prompt-lookup verifies the text's own
// continuation (the latest earlier match of its last 1-3 tokens) instead of the drafter's block; --no-draft
// is --draft none (target-only). --width rule: the width rule picks each round's
// verify width from the drafter's calibrated confidences and this device's costs (costs-executorch.json beside
// the export, from `hyflash profile EXPORT --backend executorch --write-costs`), resting the drafter where
// drafting does not pay. --profile times each call the loop makes at the committed lengths --contexts (R calls
// each, default 15, medians) and prints the width rule's costs as JSON; --write-costs also writes them beside the
// export (costs-hyflash-run.json), which --width rule then reads before the Python runtime's costs-executorch.json:
// the runner's calls cost what they cost here, not what they cost through Python. --threads N sets ExecuTorch's
// thread pool (default:
// one thread per core). The target's cache kernels are chosen when the runner is built (HYFLASH_KERNELS: the
// project's libhyflash_kernels.so, or ExecuTorch's LLM kernels linked instead); --pte-kernels names the one
// expected and refuses the other; the JSON output records it. Bad input: one line on stderr, exit 2.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include "json.h"
#include "runner.h"
#include "widths.h"

// ExecuTorch's thread pool (libexecutorch_threadpool.so; the wheel ships no header for it)
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  bool _unsafe_reset_threadpool(uint32_t num_threads);
  size_t get_thread_count() const;
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool

namespace {

#ifndef HYFLASH_PTE_KERNELS
#define HYFLASH_PTE_KERNELS "hyflash"
#endif

#ifdef HYFLASH_KERNELS_LINKED
}  // namespace
extern "C" const char hyflash_kernels_stamp[];  // libhyflash_kernels.so: "hyflash-kernels executorch=VERSION"
namespace {
const char* kernels_stamp() { return hyflash_kernels_stamp; }
#else
const char* kernels_stamp() { return "ExecuTorch's LLM kernels, linked in"; }
#endif

constexpr int kExitUsage = 2;

// ExecuTorch's log lines go to stderr: errors always, debug and info lines (CPU probing at load, ...)
// only with HYFLASH_RUN_VERBOSE=1, so that a refused input reads as one line.
void log_line(et_timestamp_t, et_pal_log_level_t level, const char* file, const char*, size_t line,
              const char* message, size_t length) {
  static const bool verbose = std::getenv("HYFLASH_RUN_VERBOSE") != nullptr;
  if (level == kDebug || (level == kInfo && !verbose)) return;
  std::fprintf(stderr, "%c executorch:%s:%zu] %.*s\n", static_cast<char>(level), file, line,
               static_cast<int>(length), message);
}
const char* const kUsage =
    "usage: hyflash-run EXPORT --prompt-ids 1,2,3 [--max-new-tokens N] [--temperature T] [--top-p P] "
    "[--top-k K] [--seed S] [--ignore-eos] [--draft model|prompt-lookup|none] [--no-draft] [--width W|rule] [--repeat R] [--threads N] [--pte-kernels hyflash|executorch] "
    "[--json] | EXPORT --conversation [...] < one conversation so far per line | EXPORT --profile [--contexts 256,1024] [--repeat R] [--threads N] [--write-costs] | --version";

struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

int64_t parse_int(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno) throw UsageError(flag + " expects an integer, got '" + text + "'");
  return v;
}

double parse_float(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v)) throw UsageError(flag + " expects a number, got '" + text + "'");
  return v;
}

std::vector<int64_t> parse_ids(const std::string& flag, const std::string& text) {
  std::vector<int64_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    ids.push_back(parse_int(flag, item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

struct Args {
  std::string folder;
  std::vector<int64_t> prompt;
  bool have_prompt = false, json = false, profile = false, write_costs = false, have_repeat = false;
  bool conversation = false;
  int64_t repeat = 1, threads = 0;
  std::vector<int64_t> contexts = {256, 1024};
  std::string kernels = HYFLASH_PTE_KERNELS;
  hyflash::GenerationConfig cfg;
};

Args parse(int argc, char** argv) {
  Args a;
  std::vector<std::string> rest(argv + 1, argv + argc);
  auto value = [&](size_t& i) -> const std::string& {
    if (i + 1 >= rest.size()) throw UsageError(rest[i] + " expects a value");
    return rest[++i];
  };
  for (size_t i = 0; i < rest.size(); ++i) {
    const std::string& f = rest[i];
    if (f == "--prompt-ids") a.prompt = parse_ids(f, value(i)), a.have_prompt = true;
    else if (f == "--profile") a.profile = true;
    else if (f == "--conversation") a.conversation = true;
    else if (f == "--contexts") a.contexts = parse_ids(f, value(i));
    else if (f == "--write-costs") a.write_costs = true;
    else if (f == "--max-new-tokens") a.cfg.max_new_tokens = parse_int(f, value(i));
    else if (f == "--temperature") a.cfg.sampling.temperature = parse_float(f, value(i));
    else if (f == "--top-p") a.cfg.sampling.top_p = parse_float(f, value(i));
    else if (f == "--top-k") a.cfg.sampling.top_k = parse_int(f, value(i));
    else if (f == "--seed") a.cfg.seed = static_cast<uint64_t>(parse_int(f, value(i)));
    else if (f == "--repeat") a.repeat = parse_int(f, value(i)), a.have_repeat = true;
    else if (f == "--threads") {
      a.threads = parse_int(f, value(i));
      if (a.threads < 1) throw UsageError("--threads must be >= 1, got " + std::to_string(a.threads));
    }
    else if (f == "--pte-kernels") a.kernels = value(i);
    else if (f == "--ignore-eos") a.cfg.ignore_eos = true;
    else if (f == "--no-draft") a.cfg.draft = false;
    else if (f == "--draft") {
      const std::string& d = value(i);
      if (d != "model" && d != "prompt-lookup" && d != "none")
        throw UsageError("--draft must be model, prompt-lookup or none, got '" + d + "'");
      a.cfg.draft = d != "none", a.cfg.lookup = d == "prompt-lookup";
    }
    else if (f == "--width") {
      const std::string& w = value(i);
      if (w == "rule") a.cfg.rule = true;
      else a.cfg.width = parse_int(f, w), a.cfg.rule = false;
    }
    else if (f == "--json") a.json = true;
    else if (f == "-h" || f == "--help") { std::cout << kUsage << "\n"; std::exit(0); }
    else if (f == "--version") { std::cout << "hyflash-run, kernels: " << kernels_stamp() << "\n"; std::exit(0); }
    else if (f.rfind("--", 0) == 0) throw UsageError("unknown option " + f);
    else if (a.folder.empty()) a.folder = f;
    else throw UsageError("unexpected argument '" + f + "'");
  }
  if (a.folder.empty()) throw UsageError("give the export folder");
  if (a.profile && !a.have_repeat) a.repeat = 15;
  if (a.write_costs && !a.profile) throw UsageError("--write-costs writes what --profile measures: add --profile");
  if (a.conversation && (a.have_prompt || a.profile || a.have_repeat))
    throw UsageError(std::string("--conversation reads its turns from stdin: drop ") +
                     (a.have_prompt ? "--prompt-ids" : a.profile ? "--profile" : "--repeat"));
  if (!a.have_prompt && !a.profile && !a.conversation)
    throw UsageError("give the prompt as --prompt-ids 1,2,3 (or --conversation, turns on stdin)");
  if (a.cfg.max_new_tokens < 1) throw UsageError("--max-new-tokens must be >= 1, got " + std::to_string(a.cfg.max_new_tokens));
  if (a.cfg.sampling.temperature < 0) throw UsageError("--temperature must be >= 0");
  if (!(a.cfg.sampling.top_p > 0 && a.cfg.sampling.top_p <= 1)) throw UsageError("--top-p must be in (0, 1]");
  if (a.cfg.sampling.top_k < 0) throw UsageError("--top-k must be >= 0 (0 = off)");
  if (a.repeat < 1) throw UsageError("--repeat must be >= 1");
  if (a.kernels != "hyflash" && a.kernels != "executorch")
    throw UsageError("--pte-kernels must be hyflash or executorch, got '" + a.kernels + "'");
  if (a.kernels != HYFLASH_PTE_KERNELS)
    throw UsageError(std::string("this hyflash-run runs the ") + HYFLASH_PTE_KERNELS + " kernels; the " + a.kernels +
                     " kernels need a build with HYFLASH_KERNELS=" + (a.kernels == "hyflash" ? "ON" : "OFF"));
  return a;
}

std::string cpu_name() {  // Linux's model name, where it says one
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      const size_t start = line.find_first_not_of(" \t", line.find(':') + 1);
      return start == std::string::npos ? "" : line.substr(start);
    }
  return "";
}

// --profile: the runner's costs as JSON on stdout; with --write-costs the same beside the export, written whole
// (a temporary file renamed over the old one) or not at all
int profile(hyflash::Runner& runner, const Args& a, size_t threads) {
  const hyflash::CostCurve curve = runner.profile(a.contexts, a.repeat);
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  const std::string doc = "{\"backend\": \"hyflash-run\", \"cpu\": " + hyflash::json::quote(cpu_name()) +
                          ", \"threads\": " + std::to_string(threads) + ", \"repeats\": " + std::to_string(a.repeat) +
                          ", \"pte_kernels\": \"" + HYFLASH_PTE_KERNELS + "\", \"date\": \"" + date + "\", " +
                          hyflash::points_json(curve) + "}";
  if (a.write_costs) {
    const std::string path = a.folder + "/" + hyflash::kRunnerCosts, tmp = path + ".partial";
    {
      std::ofstream out(tmp);
      out << doc << "\n";
      if (!out.flush()) {
        std::remove(tmp.c_str());
        throw std::runtime_error(tmp + ": cannot write the costs (is the export folder writable?)");
      }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      std::remove(tmp.c_str());
      throw std::runtime_error(path + ": cannot replace it with the new costs");
    }
    std::fprintf(stderr, "wrote %s: the width rule's costs for hyflash-run on this device\n", path.c_str());
  }
  std::cout << doc << "\n";
  std::cout.flush();
  return 0;
}

// One generation's output: its JSON line (what `hyflash generate --json` prints, with the kernels and threads it
// ran), or its ids on stdout and a summary on stderr
void print(const hyflash::Stats& stats, bool json, size_t threads) {
  if (json) {
    std::string line = stats.to_json();
    line.pop_back();
    std::cout << line << ", \"pte_kernels\": \"" << HYFLASH_PTE_KERNELS << "\", \"threads\": " << threads << "}\n";
    return;
  }
  for (size_t i = 0; i < stats.tokens.size(); ++i) std::cout << (i ? "," : "") << stats.tokens[i];
  std::cout << "\n";
  std::fprintf(stderr, "%zu tokens, tau %.2f tokens/round, %.1f tokens/s, prefilled %lld of %lld in %.3f s, stop: %s\n",
               stats.tokens.size(), stats.acceptance_length(), stats.tokens_per_s(),
               static_cast<long long>(stats.prefilled), static_cast<long long>(stats.prompt_tokens), stats.prefill_s,
               stats.stop_reason.c_str());
}

// --conversation: one generation per line of stdin (the conversation so far), the runner's context kept between
// them; each answer flushed before the next line is read
int converse(hyflash::Runner& runner, Args& a, size_t threads) {
  const uint64_t seed = a.cfg.seed;
  int64_t turn = 0;
  for (std::string line; std::getline(std::cin, line);) {
    const size_t start = line.find_first_not_of(" \t\r");
    if (start == std::string::npos) continue;  // a blank line
    std::vector<int64_t> prompt;
    try {
      prompt = parse_ids("turn " + std::to_string(turn + 1),
                         line.substr(start, line.find_last_not_of(" \t\r") + 1 - start));
    } catch (const UsageError& e) {
      throw std::invalid_argument(std::string(e.what()) + " (each line: the conversation's ids, comma-separated)");
    }
    a.cfg.seed = seed + static_cast<uint64_t>(turn++);
    print(runner.generate(prompt, a.cfg, /*reuse=*/true), a.json, threads);
    std::cout.flush();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  executorch::runtime::register_pal(executorch::runtime::PalImpl::create(log_line, __FILE__));
  executorch::runtime::runtime_init();
  try {
    Args a = parse(argc, argv);
    auto* pool = executorch::extension::threadpool::get_threadpool();
    if (a.threads > 0 && pool) pool->_unsafe_reset_threadpool(static_cast<uint32_t>(a.threads));
    const size_t threads = pool ? pool->get_thread_count() : 1;
    hyflash::Runner runner(a.folder, HYFLASH_PTE_KERNELS);
    if (a.profile) return profile(runner, a, threads);
    if (a.conversation) return converse(runner, a, threads);
    const uint64_t seed = a.cfg.seed;
    for (int64_t r = 0; r < a.repeat; ++r) {
      a.cfg.seed = seed + static_cast<uint64_t>(r);
      print(runner.generate(a.prompt, a.cfg), a.json, threads);
    }
    std::cout.flush();
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "hyflash-run: error: %s\n%s\n", e.what(), kUsage);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hyflash-run: error: %s\n", e.what());
  }
  return kExitUsage;
}
