#include "runner.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>

namespace hyflash {

using executorch::aten::ScalarType;
using executorch::extension::Module;
using executorch::runtime::EValue;
using executorch::runtime::Error;
using Clock = std::chrono::steady_clock;

namespace {

const char* const kStateNames[] = {"win_k", "win_v", "win_pos", "ssm_state", "conv_state"};
const char* const kTargetGraphs[] = {"target_prefill", "target_verify", "target_decode"};
const char* const kDrafterGraphs[] = {"draft_read", "state_commit", "window_shift"};

bool is_state(const std::string& name) {
  return std::find(std::begin(kStateNames), std::end(kStateNames), name) != std::end(kStateNames);
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string error_name(Error e) {
  switch (e) {
    case Error::OperatorMissing: return "OperatorMissing";
    case Error::InvalidProgram: return "InvalidProgram";
    case Error::InvalidArgument: return "InvalidArgument";
    case Error::NotFound: return "NotFound";
    case Error::MemoryAllocationFailed: return "MemoryAllocationFailed";
    default: return "error " + std::to_string(static_cast<int>(e));
  }
}

}  // namespace

Buffer::Buffer(const TensorSpec& s) : spec(s) {
  std::vector<executorch::aten::SizesType> sizes(s.shape.begin(), s.shape.end());
  if (s.dtype == "int64") {
    ints.assign(s.numel(), 0);
    tensor = executorch::extension::from_blob(ints.data(), sizes, ScalarType::Long);
  } else {
    floats.assign(s.numel(), 0.f);
    tensor = executorch::extension::from_blob(floats.data(), sizes, ScalarType::Float);
  }
}

void Buffer::fill_state() {
  std::fill(floats.begin(), floats.end(), 0.f);
  std::fill(ints.begin(), ints.end(), spec.name == "win_pos" ? -1 : 0);
}

// ------------------------------------------------------------------------------------------ stats

double Stats::acceptance_length() const {
  return rounds ? static_cast<double>(tokens.size() - 1) / rounds : 0.0;
}

double Stats::tokens_per_s() const { return decode_s > 0 ? (tokens.size() - 1) / decode_s : 0.0; }

std::string Stats::to_json() const {
  auto list = [](const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  std::string ms = "{", calls = "{", bytes = "{", rows = "{";
  for (const auto& [w, n] : widths) rows += (rows.size() > 1 ? ", " : "") + json::quote(std::to_string(w)) + ": " + std::to_string(n);
  for (const auto& [g, total] : graph_ms) {
    ms += (ms.size() > 1 ? ", " : "") + json::quote(g) + ": " + json::number(total / graph_calls.at(g));
    calls += (calls.size() > 1 ? ", " : "") + json::quote(g) + ": " + std::to_string(graph_calls.at(g));
  }
  for (const auto& [k, v] : drafter_context_bytes) bytes += (bytes.size() > 1 ? ", " : "") + json::quote(k) + ": " + std::to_string(v);
  return "{\"tokens\": " + list(tokens) + ", \"prompt_tokens\": " + std::to_string(prompt_tokens) +
         ", \"rounds\": " + std::to_string(rounds) + ", \"acceptance_length\": " + json::number(acceptance_length()) +
         ", \"accepted_per_slot\": " + list(accepted_per_slot) + ", \"tokens_per_s\": " + json::number(tokens_per_s()) +
         ", \"prefill_s\": " + json::number(prefill_s) + ", \"prefilled\": " + std::to_string(prefilled) +
         ", \"decode_s\": " + json::number(decode_s) + ", \"graph_ms\": " + ms + "}, \"graph_calls\": " + calls +
         "}, \"stop_reason\": " + json::quote(stop_reason) + ", \"drafter_context_bytes\": " + bytes +
         "}, \"widths\": " + rows + "}, \"rested_rounds\": " + std::to_string(rested_rounds) +
         (costs_file.empty() ? "" : ", \"costs\": " + json::quote(costs_file)) +
         "}";  // no lookup_rounds / skipped_reads: hybrid drafting is the Python runtime's
}

// ----------------------------------------------------------------------------------------- runner

Runner::Runner(const std::string& folder, const std::string& kernels) : m_(load_manifest(folder)) {
  namespace fs = std::filesystem;
  for (const char* g : kTargetGraphs)
    if (m_.graph(g).pte_file.empty())
      throw ArtifactError(folder + ": this export has no .pte programs; export with --format pte (or both)");
  if (m_.pte_verify_attention == "block" && kernels != "hyflash")
    throw ArtifactError(folder + ": this program's verify blocks attend in one call, exact only with the project's "
                        "cache kernels; build hyflash-run with HYFLASH_KERNELS=ON, or re-export with --pte-kernels "
                        "executorch");
  auto open = [&](const std::string& rel, bool share) {
    // one Module per model, even over one file: the target's three methods share its mutable buffers (the
    // cache) through shared arenas, and the drafter's methods must not run in those arenas (a call there
    // overwrites the outputs the loop still reads); with Mmap the file is mapped, not read twice
    return std::make_unique<Module>((fs::path(folder) / rel).string(), Module::LoadMode::Mmap, nullptr, nullptr,
                                    nullptr, share);
  };
  for (const auto& [name, spec] : m_.graphs) {  // each model's methods in one program
    const std::string& first = m_.graph(spec.model == "target" ? "target_verify" : "draft_read").pte_file;
    if (spec.pte_file != first)
      throw ArtifactError(folder + ": graph " + name + " is in '" + spec.pte_file + "', not in '" + first +
                          "' with the rest of its model; re-export");
  }
  target_ = open(m_.graph("target_verify").pte_file, true);
  drafter_ = open(m_.graph("draft_read").pte_file, false);
  for (const auto& [name, spec] : m_.graphs) {
    Module& module = spec.model == "target" ? *target_ : *drafter_;
    Error e = module.load_method(spec.pte_method);
    if (e != Error::Ok) {
      const std::string where = folder + "/" + spec.pte_file + ": method " + spec.pte_method + " does not load: ";
      if (e == Error::OperatorMissing && kernels != "hyflash")  // nothing linked registers the cache kernels
        throw ArtifactError(where + "a kernel it needs is not registered (see the log above); this hyflash-run was "
                            "built with HYFLASH_KERNELS=OFF: link ExecuTorch's LLM custom ops library, or build with "
                            "HYFLASH_KERNELS=ON");
      std::string why = e == Error::OperatorMissing
                            ? "a kernel it needs is not registered (the target methods need llama::update_cache and "
                              "llama::custom_sdpa, which this runner carries; see the log above)"
                            : error_name(e);
      throw ArtifactError(where + why + "; re-export with this version of hyflash");
    }
    check_method(module, name);
  }
  for (const auto& [name, spec] : m_.graphs)
    for (const auto& t : spec.inputs) {
      if (is_state(t.name)) {
        if (!state_.count(t.name)) state_[t.name] = std::make_unique<Buffer>(t);
      } else {
        std::string key = spec.model == "target" ? name + "/" + t.name : t.name;
        if (!small_.count(key)) small_[key] = std::make_unique<Buffer>(t);
      }
    }
  for (const char* graph : {"state_commit", "window_shift"}) {  // each X_out is copied over X: same size
    if (!m_.graphs.count(graph)) continue;
    for (const auto& t : m_.graph(graph).outputs) {
      auto it = state_.find(t.name.substr(0, t.name.size() - 4));
      if (t.name.size() < 5 || t.name.compare(t.name.size() - 4, 4, "_out") != 0 || it == state_.end() ||
          it->second->spec.shape != t.shape || it->second->spec.dtype != t.dtype)
        throw ArtifactError(folder + ": " + graph + " output " + t.name +
                            " does not match the context it replaces; re-export");
    }
  }
  for (const auto& [name, spec] : m_.graphs) calls_[name] = bind(name, spec.model == "target" ? target_.get() : drafter_.get());
  calibration_ = read_calibration(m_.raw.at("drafter").find("hybrid"));
  reset_context();
}

void Runner::check_method(Module& module, const std::string& graph) {
  const GraphSpec& spec = m_.graph(graph);
  auto meta = module.method_meta(spec.pte_method);
  std::string where = m_.folder + "/" + spec.pte_file + " method " + spec.pte_method;
  if (!meta.ok()) throw ArtifactError(where + ": no metadata; re-export");
  for (int kind = 0; kind < 2; ++kind) {
    const auto& declared = kind ? spec.outputs : spec.inputs;
    size_t n = kind ? meta->num_outputs() : meta->num_inputs();
    std::string what = kind ? "outputs" : "inputs";
    if (n != declared.size())
      throw ArtifactError(where + ": the manifest declares " + std::to_string(declared.size()) + " " + what +
                          ", the graph has " + std::to_string(n) + "; re-export");
    for (size_t i = 0; i < n; ++i) {
      auto info = kind ? meta->output_tensor_meta(i) : meta->input_tensor_meta(i);
      const TensorSpec& t = declared[i];
      if (!info.ok()) throw ArtifactError(where + ": " + what + " " + std::to_string(i) + " is not a tensor; re-export");
      ScalarType want = t.dtype == "int64" ? ScalarType::Long : ScalarType::Float;
      auto sizes = info->sizes();
      std::vector<int64_t> got(sizes.begin(), sizes.end());
      if (info->scalar_type() != want || got != t.shape)
        throw ArtifactError(where + ": " + what.substr(0, what.size() - 1) + " " + std::to_string(i) + " (" + t.name +
                            ") differs from the manifest in dtype or shape; re-export");
    }
  }
}

Runner::Call Runner::bind(const std::string& graph, Module* module) {
  const GraphSpec& spec = m_.graph(graph);
  Call call{graph, spec.pte_method, "prefill/" + graph, module, {}, {}};
  for (size_t i = 0; i < spec.outputs.size(); ++i) call.outputs[spec.outputs[i].name] = i;
  for (const auto& t : spec.inputs) {
    Buffer& b = is_state(t.name) ? *state_.at(t.name) : *small_.at(spec.model == "target" ? graph + "/" + t.name : t.name);
    call.inputs.emplace_back(*b.tensor);
  }
  return call;
}

Runner::Outputs Runner::run(const std::string& key, Stats& stats) {
  Call& call = calls_.at(key);
  auto t = Clock::now();
  auto result = call.module->execute(call.method, call.inputs);
  if (!result.ok())
    throw std::runtime_error(call.graph + " failed to run (" + error_name(result.error()) + ")");
  const std::string& name = stats.decoding ? call.graph : call.prefill_key;
  stats.graph_ms[name] += seconds_since(t) * 1e3;
  stats.graph_calls[name] += 1;
  return std::move(result.get());
}

namespace {
// A call's output `name` (arena memory: valid until the method runs again).
template <typename T>
const T* output(const std::map<std::string, size_t>& index, const std::vector<EValue>& outs, const std::string& name) {
  auto it = index.find(name);
  if (it == index.end()) throw ArtifactError("the graph has no output '" + name + "'; re-export");
  return outs.at(it->second).toTensor().const_data_ptr<T>();
}
// Prompt-lookup, as models/lookup.py: the `block` tokens after the latest earlier occurrence of the longest
// suffix n-gram of `history` (n = 3..1: MAX_NGRAM there, which the lookup-input drafter's gates are sized by),
// padded with their last; without a match the last token repeated, n = 0.
std::pair<std::vector<int64_t>, int64_t> lookup(const std::vector<int64_t>& history, int64_t block) {
  const int64_t len = static_cast<int64_t>(history.size());
  for (int64_t n = std::min<int64_t>(3, len - 1); n >= 1; --n) {
    for (int64_t i = len - 1 - n; i >= 0; --i) {  // every earlier n-gram, the latest first
      if (!std::equal(history.begin() + i, history.begin() + i + n, history.end() - n)) continue;
      const int64_t start = i + n, end = std::min(len, start + block);
      std::vector<int64_t> out(history.begin() + start, history.begin() + end);
      out.resize(block, out.back());
      return {out, n};
    }
  }
  return {std::vector<int64_t>(block, history.back()), 0};
}
}  // namespace

void Runner::check_room(int64_t pos, int64_t width) const {
  if (pos < 0 || pos > committed_ || pos + width > m_.max_context)
    throw std::runtime_error("a " + std::to_string(width) + "-row call at position " + std::to_string(pos) +
                             " does not fit the cache (" + std::to_string(committed_) + " committed of " +
                             std::to_string(m_.max_context) + " rows)");
}

std::pair<const float*, const float*> Runner::run_target(const std::string& graph, const std::vector<int64_t>& tokens,
                                                         int64_t pos, Stats& stats, Outputs& keep) {
  Buffer &ids = *small_.at(graph + "/tokens"), &positions = *small_.at(graph + "/positions");
  const int64_t width = static_cast<int64_t>(ids.ints.size());
  check_room(pos, width);
  std::fill(ids.ints.begin(), ids.ints.end(), 0);  // padding rows: any valid id
  std::copy(tokens.begin(), tokens.end(), ids.ints.begin());
  for (int64_t r = 0; r < width; ++r) positions.ints[r] = pos + r;
  keep = run(graph, stats);
  const auto& index = calls_.at(graph).outputs;
  return {output<float>(index, keep, "logits"), output<float>(index, keep, "features")};
}

const int64_t* Runner::draft(int64_t anchor, int64_t pos, const std::vector<int64_t>& history, Stats& stats,
                             Outputs& keep) {
  small_.at("anchor_token")->ints[0] = anchor;
  small_.at("anchor_pos")->ints[0] = pos;
  if (small_.count("lookup_tokens")) {  // a lookup-input drafter
    auto [found, n] = lookup(history, m_.block);
    std::copy(found.begin(), found.end(), small_.at("lookup_tokens")->ints.begin());
    small_.at("lookup_match")->ints[0] = n;
  }
  keep = run("draft_read", stats);
  const int64_t* drafts = output<int64_t>(calls_.at("draft_read").outputs, keep, "draft_tokens");
  for (int64_t i = 0; i < m_.block; ++i)
    if (drafts[i] < 0 || drafts[i] >= m_.vocab)
      throw std::runtime_error("draft_read returned token id " + std::to_string(drafts[i]) +
                               " outside the vocabulary; the drafter program is damaged: re-export");
  return drafts;
}

void Runner::fold(const float* features, int64_t pos, int64_t n, Stats& stats) {
  Buffer& feats = *small_.at("features");
  const size_t width = feats.floats.size() / kVerifyRows;
  std::copy(features, features + n * width, feats.floats.begin());  // rows >= n are never read (n_valid)
  small_.at("n_valid")->ints[0] = n;
  Buffer& positions = *small_.at("positions");
  for (int64_t r = 0; r < kVerifyRows; ++r) positions.ints[r] = pos + r;
  for (const char* graph : {"state_commit", "window_shift"}) {
    if (!m_.graphs.count(graph)) continue;  // no memory: no state_commit
    Outputs outs = run(graph, stats);
    const GraphSpec& spec = m_.graph(graph);
    for (size_t i = 0; i < spec.outputs.size(); ++i) {  // X_out -> X: the new context
      const std::string& name = spec.outputs[i].name;
      Buffer& dst = *state_.at(name.substr(0, name.size() - 4));
      std::memmove(dst.data(), outs[i].toTensor().const_data_ptr(), dst.nbytes());
    }
  }
}

void Runner::pend(const float* row, int64_t pos, Stats& stats) {
  const size_t width = small_.at("features")->floats.size() / kVerifyRows;
  if (!pending_rows_) pending_pos_ = pos;
  pending_.resize((pending_rows_ + 1) * width);
  std::copy(row, row + width, pending_.begin() + pending_rows_ * width);
  if (++pending_rows_ == kVerifyRows) flush(stats);
}

void Runner::flush(Stats& stats) {
  if (!pending_rows_) return;
  fold(pending_.data(), pending_pos_, pending_rows_, stats);
  pending_rows_ = 0;
}

void Runner::reset_context() {
  for (auto& [name, b] : state_) b->fill_state();
}

void Runner::check_prompt(const std::vector<int64_t>& prompt) const {
  if (prompt.empty()) throw std::invalid_argument("the prompt is empty; give at least one token");
  for (int64_t t : prompt)
    if (t < 0 || t >= m_.vocab)
      throw std::invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                                  std::to_string(m_.vocab - 1) + ")");
  if (static_cast<int64_t>(prompt.size()) >= m_.usable_context())
    throw std::invalid_argument("the prompt has " + std::to_string(prompt.size()) +
                                " tokens; this export's usable context is " + std::to_string(m_.usable_context()) +
                                " (max_context " + std::to_string(m_.max_context) + " - " +
                                std::to_string(kVerifyRows) +
                                "): shorten the prompt or export with a larger --max-context");
}

std::vector<int64_t> Runner::stop(const std::vector<int64_t>& fresh, Stats& stats, const GenerationConfig& cfg,
                                  int64_t prompt_len, int64_t limit) const {
  const int64_t done = static_cast<int64_t>(stats.tokens.size()), room = limit - prompt_len - done;
  std::vector<int64_t> out;
  for (int64_t t : fresh) {
    if (static_cast<int64_t>(out.size()) == room) break;
    out.push_back(t);
    if (!cfg.ignore_eos && std::find(m_.eos.begin(), m_.eos.end(), t) != m_.eos.end()) {
      stats.stop_reason = "eos";
      return out;
    }
  }
  if (prompt_len + done + static_cast<int64_t>(out.size()) >= limit)
    stats.stop_reason = limit < m_.usable_context()
                            ? "max_new_tokens"
                            : "usable context reached (" + std::to_string(m_.usable_context()) +
                                  " tokens = max_context " + std::to_string(m_.max_context) + " - " +
                                  std::to_string(kVerifyRows) + ")";
  return out;
}

std::map<std::string, int64_t> Runner::context_bytes(int64_t committed) const {
  const int64_t win = state_.at("win_k")->nbytes() + state_.at("win_v")->nbytes();
  const int64_t occupied = win * std::min(committed, m_.window) / m_.window, pos = state_.at("win_pos")->nbytes();
  int64_t state = 0;
  for (const char* name : {"ssm_state", "conv_state"})
    if (state_.count(name)) state += state_.at(name)->nbytes();
  return {{"allocated", win + pos + state}, {"occupied", occupied + pos + state}, {"window_allocated", win},
          {"window_occupied", occupied}, {"state", state},
          {"target_kv_allocated", m_.raw.at("memory").at("target_kv_bytes").as_int()}};
}

int64_t Runner::reusable(const std::vector<int64_t>& prompt, bool uses_drafter) const {
  const size_t most = std::min(kept_tokens_.size(), prompt.size() - 1);
  const int64_t n = std::mismatch(kept_tokens_.begin(), kept_tokens_.begin() + most, prompt.begin()).first -
                    kept_tokens_.begin();
  return uses_drafter && !(drafter_kept_ && n == static_cast<int64_t>(kept_tokens_.size())) ? 0 : n;
}

void Runner::prefill(const std::vector<int64_t>& prompt, bool uses_drafter, Stats& stats, Outputs& keep,
                     int64_t from) {
  const int64_t len = static_cast<int64_t>(prompt.size()), vocab = m_.vocab;
  committed_ = from;
  pending_rows_ = 0;
  if (from == 0) reset_context();
  stats.prefilled = len - from;
  for (int64_t pos = from; pos < len;) {
    std::string graph = pos + m_.prefill_chunk <= m_.max_context ? "target_prefill" : "target_verify";
    int64_t width = m_.graph(graph).io("tokens").shape[0], n = std::min(width, len - pos);
    std::vector<int64_t> ids(prompt.begin() + pos, prompt.begin() + pos + n);
    auto [logits, feats] = run_target(graph, ids, pos, stats, keep);
    committed_ = pos + n;
    const int64_t feature = m_.graph(graph).io("features").shape[1];
    if (uses_drafter)
      for (int64_t r = 0; r < n; r += kVerifyRows) fold(feats + r * feature, pos + r, std::min<int64_t>(kVerifyRows, n - r), stats);
    last_logits_.assign(logits + (n - 1) * vocab, logits + n * vocab);  // the arena is reused by the next call
    pos += n;
  }
}

CostCurve Runner::profile(const std::vector<int64_t>& contexts, int64_t repeats) {
  if (repeats < 1) throw std::invalid_argument("--repeat must be >= 1, got " + std::to_string(repeats));
  std::vector<int64_t> lengths(contexts);
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  if (lengths.empty()) throw std::invalid_argument("--contexts is empty; give committed lengths such as 256,1024");
  for (int64_t c : lengths)
    if (c < 1 || c >= m_.usable_context())
      throw std::invalid_argument("--contexts " + std::to_string(c) + " does not fit this export: give committed " +
                                  "lengths from 1 to " + std::to_string(m_.usable_context() - 1));
  auto median_ms = [repeats](const std::function<void()>& call) {
    call();  // warm-up
    std::vector<double> ms(repeats);
    for (double& t : ms) {
      auto start = Clock::now();
      call();
      t = seconds_since(start) * 1e3;
    }
    std::sort(ms.begin(), ms.end());
    return repeats % 2 ? ms[repeats / 2] : (ms[repeats / 2 - 1] + ms[repeats / 2]) / 2;
  };
  CostCurve curve;
  for (int64_t c : lengths) {
    std::vector<int64_t> prompt(c);
    for (int64_t i = 0; i < c; ++i) prompt[i] = (i * 7919 + 11) % m_.vocab;  // any ids: a call's cost is its shape's
    Stats stats;
    Outputs target_out, draft_out;
    prefill(prompt, true, stats, target_out);
    stats.decoding = true;
    const int64_t tok = prompt.back();
    Costs costs;
    costs.verify[1] = median_ms([&] { run_target("target_decode", {tok}, c, stats, target_out); });
    for (int64_t w : m_.verify_widths)
      costs.verify[w] = median_ms([&] { run_target(verify_graph(w), std::vector<int64_t>(w, tok), c, stats, target_out); });
    costs.draft = median_ms([&] { draft(tok, c, prompt, stats, draft_out); });
    // a full commit's calls at c, their outputs never copied back: the context stays put
    small_.at("n_valid")->ints[0] = kVerifyRows;
    for (int64_t r = 0; r < kVerifyRows; ++r) small_.at("positions")->ints[r] = c + r;
    for (const char* graph : {"state_commit", "window_shift"})
      if (m_.graphs.count(graph)) costs.commit += median_ms([&] { run(graph, stats); });
    curve.lengths.push_back(c);
    curve.points.push_back(std::move(costs));
  }
  reset_context();
  committed_ = 0;
  kept_tokens_.clear();
  drafter_kept_ = false;
  return curve;
}

Stats Runner::generate(const std::vector<int64_t>& prompt, const GenerationConfig& cfg, bool reuse) {
  check_prompt(prompt);
  if (cfg.max_new_tokens < 1) throw std::invalid_argument("--max-new-tokens must be >= 1");
  const auto& widths = m_.verify_widths;
  if (!cfg.rule && std::find(widths.begin(), widths.end(), cfg.width) == widths.end())
    throw std::invalid_argument("--width " + std::to_string(cfg.width) + " is not among this export's verify widths");
  Stats stats;
  stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  Rng rng(cfg.seed);
  const int64_t vocab = m_.vocab, block = m_.block, len = stats.prompt_tokens;
  // the width rule: this device's costs, read before anything runs
  std::unique_ptr<WidthRule> rule;
  const bool has_confidence = m_.graph("draft_read").has("confidence");
  const bool uses_drafter = cfg.draft && !cfg.lookup;  // the drafter's context is kept (prefill and commits fold)
  if (cfg.draft && cfg.rule) {
    CostCurve curve = read_costs(m_.folder, widths);
    stats.costs_file = curve.file;
    rule = std::make_unique<WidthRule>(std::move(curve), len, uses_drafter);
  }
  Outputs target_out, draft_out;
  std::vector<int64_t> history(prompt);  // the prompt and every emitted token: ends with the anchor

  // 1. prefill: every prompt row into the cache and the drafter (with reuse, those the context does not hold yet)
  const int64_t from = reuse ? reusable(prompt, uses_drafter) : 0;
  kept_tokens_.clear();  // until this generation ends, nothing is known kept (an error leaves nothing to reuse)
  drafter_kept_ = false;
  auto t0 = Clock::now();
  prefill(prompt, uses_drafter, stats, target_out, from);
  stats.prefill_s = seconds_since(t0);
  stats.decoding = true;

  int64_t pos = len;  // the anchor's position: rows < pos are committed
  const int64_t limit = std::min(m_.usable_context(), len + std::min(cfg.max_new_tokens, m_.usable_context()));
  int64_t anchor = choose(last_logits_.data(), vocab, cfg.sampling, rng);
  std::vector<int64_t> fresh = stop({anchor}, stats, cfg, len, limit);
  auto t1 = Clock::now();
  while (true) {
    stats.tokens.insert(stats.tokens.end(), fresh.begin(), fresh.end());
    history.insert(history.end(), fresh.begin(), fresh.end());
    if (!stats.stop_reason.empty()) break;
    if (!cfg.draft) {  // target-only: one row at a time through target_decode
      auto [logits, feats] = run_target("target_decode", {anchor}, pos, stats, target_out);
      committed_ = pos + 1;
      anchor = choose(logits, vocab, cfg.sampling, rng);
      pos += 1;
      fresh = stop({anchor}, stats, cfg, len, limit);
      continue;
    }
    // 2. draft d_1..d_7 for positions pos+1..pos+7, unless the width rule rests the drafter (a plain step);
    // the first width - 1 of them are verified (the width fixed, or the rule's pick for this block)
    const bool rested = rule && !rule->drafts();
    int64_t width = 1;
    std::vector<int64_t> drafts;
    std::vector<double> chain;  // the block's q_k (calibrated), for the rule
    if (cfg.lookup) {  // prompt-lookup: the latest earlier match of the text's end, continued
      auto [found, match] = lookup(history, block);
      width = cfg.width;
      if (rule) {
        chain = lookup_chain(calibration_, match, block);
        width = rule->pick(chain, pos);
      }
      drafts.assign(found.begin(), found.begin() + width - 1);
    } else if (!rested) {
      flush(stats);  // the drafter's context holds every committed row before it drafts
      const int64_t* d = draft(anchor, pos, history, stats, draft_out);
      width = cfg.width;
      if (rule && has_confidence) {
        chain = drafter_chain(calibration_, output<float>(calls_.at("draft_read").outputs, draft_out, "confidence"), block);
        width = rule->pick(chain, pos);
      } else if (rule) {
        width = kVerifyRows;  // a block that comes with no estimate: verified whole
      }
      drafts.assign(d, d + width - 1);
    }
    // 3. verify [anchor, d_1..] at pos.. (all its rows written; rejected ones go stale)
    std::vector<int64_t> ids = {anchor};
    ids.insert(ids.end(), drafts.begin(), drafts.end());
    auto [logits, feats] = run_target(verify_graph(width), ids, pos, stats, target_out);
    // 4. accept the longest agreeing prefix, plus the target's bonus token
    auto [k, bonus] = accept(drafts.data(), static_cast<int>(drafts.size()), logits, vocab, cfg.sampling, rng);
    stats.rounds += 1;
    stats.widths[width] += 1;
    stats.rested_rounds += rested;
    stats.accepted_per_slot.resize(block, 0);
    for (int i = 0; i < k; ++i) stats.accepted_per_slot[i] += 1;
    if (rule) rested ? rule->made_rested(pos) : rule->made_drafted(chain, width, k, pos);
    // 5. emit d_1..d_k and the bonus, cut at EOS or the token limit; the bonus is the next anchor
    std::vector<int64_t> emitted(drafts.begin(), drafts.begin() + k);
    emitted.push_back(bonus);
    fresh = stop(emitted, stats, cfg, len, limit);
    // 6. commit rows 0..n-1: the anchor and the emitted drafts but the last emitted token (a resting drafter
    // takes its row later, with up to 7 more)
    const int64_t n = static_cast<int64_t>(fresh.size());
    committed_ = pos + n;
    if (rested) {
      if (n) pend(feats, pos, stats);
    } else if (uses_drafter) {
      fold(feats, pos, n, stats);
    }
    anchor = bonus;
    pos += n;
  }
  if (uses_drafter) flush(stats);  // the drafter's context holds every committed row
  stats.decode_s = seconds_since(t1);
  kept_tokens_.assign(history.begin(), history.begin() + committed_);
  drafter_kept_ = uses_drafter;
  if (uses_drafter) stats.drafter_context_bytes = context_bytes(pos);
  return stats;
}

}  // namespace hyflash
