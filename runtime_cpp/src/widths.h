// The width rule (docs/design.md, "Verify widths"; models/widths.py and runtime_py/verifying.py): how many
// drafts a round verifies, from the drafter's calibrated chain probabilities and the export's cost curve on
// this device: the runner's own (costs-hyflash-run.json, written by `hyflash-run EXPORT --profile --write-costs`),
// else the Python runtime's on the same programs (costs-executorch.json, `hyflash profile --backend executorch
// --write-costs`).
// The same arithmetic as the Python runtime, in doubles, so both pick the same widths on the same program.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "json.h"

namespace hyflash {

// Milliseconds of one call at one committed length: verify[w] the target on w rows (w = 1: target_decode),
// draft draft_read, commit the drafter's commit (state_commit + window_shift).
struct Costs {
  std::map<int64_t, double> verify;
  double draft = 0.0, commit = 0.0;
};

// Costs at several committed lengths, read between them by linear interpolation and held flat beyond the ends.
struct CostCurve {
  std::vector<int64_t> lengths;
  std::vector<Costs> points;
  std::string file;  // the file it was read from (its name beside the export)
  Costs at(int64_t committed) const;
};

extern const char* const kRunnerCosts;  // "costs-hyflash-run.json": the runner's own costs, beside the export

// The export's costs for the runner: folder/costs-hyflash-run.json, else folder/costs-executorch.json, kept to
// width 1 and the export's verify widths; every one of them must be timed.
// Throws std::invalid_argument (one line: what and the fix).
CostCurve read_costs(const std::string& folder, const std::vector<int64_t>& widths);

// The curve's points as the costs files hold them: "points": [{"committed", "verify_ms", "draft_read_ms",
// "commit_ms"}, ...] (models/widths.py, CostCurve.to_json), without the enclosing braces.
std::string points_json(const CostCurve& curve);

// The drafter's calibration (manifest drafter.hybrid), read once: per slot, the realised rate of each
// confidence bin (-1 where the bin holds fewer than min_rounds rounds), and per lookup match length its
// measured chain (empty where too few rounds). Without a calibration both are empty.
struct Calibration {
  std::vector<std::vector<double>> slots, lookup;
};
Calibration read_calibration(const json::Value* hybrid);

// q_k, the probability that the first k drafts all pass: the head's slot confidences, each read through the
// calibration's slot table where that bin is usable; never rising with k.
std::vector<double> drafter_chain(const Calibration& cal, const float* confidence, int64_t n);

// q_k for prompt-lookup's block at match length `match`: the calibration's measured chain where it has one;
// otherwise no match verifies nothing and a match, all.
std::vector<double> lookup_chain(const Calibration& cal, int64_t match, int64_t block);

// The rule for one generation: the rate so far (modelled tokens per modelled millisecond), the drafter's
// cool-down, and the chain correction (realised against expected accepted drafts). uses_drafter false
// (prompt-lookup): blocks cost nothing to propose and nothing to commit, and the drafter never rests.
class WidthRule {
 public:
  WidthRule(CostCurve curve, int64_t start, bool uses_drafter = true);
  bool drafts();  // before a round: whether it runs the drafter (false: a plain step while it rests)
  int64_t pick(const std::vector<double>& chain, int64_t pos);  // the width for this block
  // after a drafted round (chain: the block's uncorrected chain, empty when the drafter has no confidence head)
  void made_drafted(const std::vector<double>& chain, int64_t width, int accepted, int64_t pos);
  void made_rested(int64_t pos);  // a plain step while the drafter rests

 private:
  CostCurve curve_;
  bool uses_drafter_;
  double tokens_, ms_, expected_, realised_;
  int64_t cooldown_ = 1, wait_ = 0, rest_commit_rows_ = 1;
  int64_t streak_ = 0;  // drafted rounds since the last rest
  double gain_ = 0.0;   // their average value net of draft_read over plain decoding's
  double rate() const { return tokens_ / ms_; }
  Costs costs(int64_t pos) const;
};

}  // namespace hyflash
