// The speculative loop over the .pte program's target and drafter methods, as docs/design.md (section 5) states it and
// runtime_py/loop.py runs it: prefill in chunks, draft, verify, accept, commit rows 0..k.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

#include "manifest.h"
#include "sampling.h"
#include "widths.h"

namespace hyflash {

struct GenerationConfig {
  int64_t max_new_tokens = 128;
  Sampling sampling;
  uint64_t seed = 0;
  bool ignore_eos = false;
  bool draft = true;  // false: target-only through target_decode
  bool lookup = false;  // with draft: prompt-lookup's block (the text's own continuation) instead of the drafter's
  int64_t width = kVerifyRows;  // rows verified a round (the anchor and width - 1 drafts): one of verify_widths
  bool rule = false;  // instead, the width rule picks each round's width (reads the export's costs: read_costs)
};

struct Stats {
  int64_t prompt_tokens = 0, rounds = 0;
  int64_t prefilled = 0;  // prompt tokens run through the target (fewer when a conversation's prefix was reused)
  std::vector<int64_t> tokens, accepted_per_slot;
  std::map<std::string, double> graph_ms;  // summed; reported as the mean per call
  std::map<std::string, int64_t> graph_calls;
  std::map<int64_t, int64_t> widths;  // rounds by rows verified (1: a plain step)
  int64_t rested_rounds = 0;  // the width rule: plain steps while the drafter rests (in rounds, width 1)
  std::string costs_file;  // the width rule: the costs file it read
  double prefill_s = 0, decode_s = 0;
  std::string stop_reason;
  std::map<std::string, int64_t> drafter_context_bytes;
  bool decoding = false;  // graph times are keyed "prefill/<graph>" until decoding starts

  double acceptance_length() const;
  double tokens_per_s() const;
  std::string to_json() const;  // the keys and meanings of `hyflash generate --json`
};

// One input or state tensor the runner owns: its storage and an ExecuTorch tensor over it.
struct Buffer {
  TensorSpec spec;
  std::vector<int64_t> ints;  // int64 storage
  std::vector<float> floats;  // float32 storage
  executorch::extension::TensorPtr tensor;
  explicit Buffer(const TensorSpec& s);
  void* data() { return ints.empty() ? static_cast<void*>(floats.data()) : static_cast<void*>(ints.data()); }
  size_t nbytes() const { return ints.size() * 8 + floats.size() * 4; }
  void fill_state();  // zeros; win_pos -1 (an empty window row)
};

class Runner {
 public:
  // kernels: the target's cache kernels this program links, "hyflash" (runtime_cpp's) or "executorch" (ExecuTorch's
  // LLM custom ops); a program whose verify blocks attend in one call is refused with ExecuTorch's.
  // Throws ArtifactError / std::runtime_error.
  Runner(const std::string& folder, const std::string& kernels);
  // reuse: keep what the committed context shares with `prompt` and prefill only the rest (a conversation's next
  // turn: the earlier turns and the reply as committed, then the new turn); the same tokens as without.
  Stats generate(const std::vector<int64_t>& prompt, const GenerationConfig& cfg, bool reuse = false);
  // What each call costs this runner, as the width rule reads it, at each committed length in `contexts` (each
  // from 1 to the usable context - 1): a prompt of that length prefilled, then every call the loop makes
  // (target_decode, each verify width, draft_read, state_commit + window_shift) made at that position `repeats`
  // times after a warm-up call, never committed, and the median taken. Throws std::invalid_argument.
  CostCurve profile(const std::vector<int64_t>& contexts, int64_t repeats);
  const Manifest& manifest() const { return m_; }

 private:
  using Outputs = std::vector<executorch::runtime::EValue>;
  // Everything a call needs, looked up once when the runner opens (nothing by name in the loop)
  struct Call {
    std::string graph, method, prefill_key;  // prefill_key: "prefill/<graph>", its stats key in prefill
    executorch::extension::Module* module;
    std::vector<executorch::runtime::EValue> inputs;
    std::map<std::string, size_t> outputs;  // output name -> index
  };

  Manifest m_;
  std::unique_ptr<executorch::extension::Module> target_, drafter_;
  std::map<std::string, std::unique_ptr<Buffer>> small_;  // "<graph>/tokens", "features", "n_valid", ...
  // The drafter context (window, state). ExecuTorch writes a method's outputs into its own arena,
  // so one copy suffices: each commit method reads it, then its *_out outputs are copied back.
  std::map<std::string, std::unique_ptr<Buffer>> state_;
  std::map<std::string, Call> calls_;
  int64_t committed_ = 0;
  // What a next turn may keep: the ids in committed rows 0.., and whether the drafter's context holds all of them
  // (its memory cannot forget, so with the drafter a reused prefix must be all of it or nothing)
  std::vector<int64_t> kept_tokens_;
  bool drafter_kept_ = false;
  std::vector<float> last_logits_;
  Calibration calibration_;  // the drafter's hybrid tables, for the width rule's chains
  std::vector<float> pending_;  // a resting drafter's committed feature rows, folded up to 8 at a time
  int64_t pending_pos_ = 0, pending_rows_ = 0;

  void check_method(executorch::extension::Module& module, const std::string& graph);
  Call bind(const std::string& graph, executorch::extension::Module* module);
  Outputs run(const std::string& key, Stats& stats);
  // a target graph on tokens at positions pos.. (padded to its width) -> (logits, features) views
  std::pair<const float*, const float*> run_target(const std::string& graph, const std::vector<int64_t>& tokens,
                                                   int64_t pos, Stats& stats, Outputs& keep);
  // draft_read; a drafter exported --lookup-input also reads prompt-lookup's block on `history` (ends with the anchor)
  const int64_t* draft(int64_t anchor, int64_t pos, const std::vector<int64_t>& history, Stats& stats, Outputs& keep);
  // state_commit and window_shift: the first n rows of `features` (at pos..) folded into the drafter's context
  void fold(const float* features, int64_t pos, int64_t n, Stats& stats);
  // a plain step's committed feature row (position pos), folded with up to 7 more in one commit; flush folds them
  void pend(const float* row, int64_t pos, Stats& stats);
  void flush(Stats& stats);
  void reset_context();
  // how many leading rows `prompt` can keep: its common prefix with the kept ids, short of its last token (which
  // must run to give the first logits); with the drafter, all the rows its context holds or none
  int64_t reusable(const std::vector<int64_t>& prompt, bool uses_drafter) const;
  // the prompt from row `from` (rows before it kept) through target_prefill in chunks (target_verify where a chunk
  // would pass the cache's end), every row folded into the drafter when uses_drafter; leaves the last row's logits
  // in last_logits_
  void prefill(const std::vector<int64_t>& prompt, bool uses_drafter, Stats& stats, Outputs& keep, int64_t from = 0);
  void check_room(int64_t pos, int64_t width) const;
  void check_prompt(const std::vector<int64_t>& prompt) const;
  std::vector<int64_t> stop(const std::vector<int64_t>& fresh, Stats& stats, const GenerationConfig& cfg,
                            int64_t prompt_len, int64_t limit) const;
  std::map<std::string, int64_t> context_bytes(int64_t committed) const;
};

}  // namespace hyflash
