#include "widths.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace hyflash {

namespace {
constexpr int64_t kMaxCooldown = 64;  // rounds of plain decoding before the drafter is tried again, at most
constexpr double kPriorRounds = 8;    // the starting rate counts as this many rounds of the generation's own
constexpr double kPriorDrafts = 4.0;  // the chain correction starts at 1 as if this many drafts had been realised
constexpr int64_t kMaxFold = 8;       // a rest's rows are folded into the drafter this many at a time, at most
constexpr int64_t kJudgedRounds = 4;  // a streak's average of what drafting earned weighs about this many rounds
}  // namespace

Costs CostCurve::at(int64_t committed) const {
  const size_t i = std::lower_bound(lengths.begin(), lengths.end(), committed) - lengths.begin();
  if (i == 0 || i == lengths.size()) return points[std::min(i, points.size() - 1)];
  const double t = static_cast<double>(committed - lengths[i - 1]) / static_cast<double>(lengths[i] - lengths[i - 1]);
  auto mix = [t](double u, double v) { return (1 - t) * u + t * v; };
  const Costs &a = points[i - 1], &b = points[i];
  Costs c{{}, mix(a.draft, b.draft), mix(a.commit, b.commit)};
  for (const auto& [w, ms] : a.verify) c.verify[w] = mix(ms, b.verify.at(w));
  return c;
}

const char* const kRunnerCosts = "costs-hyflash-run.json";

CostCurve read_costs(const std::string& folder, const std::vector<int64_t>& widths) {
  const std::string runner_fix = "`hyflash-run " + folder + " --profile --write-costs`";
  std::string name = kRunnerCosts, fix = runner_fix;
  std::ifstream in(folder + "/" + name);
  if (!in) {  // the Python runtime's costs on the same programs
    name = "costs-executorch.json", fix = "`hyflash profile " + folder + " --backend executorch --write-costs`";
    in.open(folder + "/" + name);
  }
  if (!in)
    throw std::invalid_argument(folder + ": no " + kRunnerCosts + " (nor costs-executorch.json); the width rule needs "
                                "this device's costs: run " + runner_fix + " first (or a fixed --width)");
  const std::string path = folder + "/" + name;
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int64_t> keep(widths);
  keep.push_back(1);
  CostCurve curve;
  try {
    json::Value doc = json::parse(text.str());
    std::vector<std::pair<int64_t, Costs>> points;
    for (const auto& p : doc.at("points").items) {
      Costs c{{}, p.at("draft_read_ms").as_double(), p.at("commit_ms").as_double()};
      for (const auto& [w, ms] : p.at("verify_ms").members) {
        const int64_t width = std::stoll(w);
        if (std::find(keep.begin(), keep.end(), width) != keep.end()) c.verify[width] = ms.as_double();
      }
      points.emplace_back(p.at("committed").as_int(), c);
    }
    std::sort(points.begin(), points.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [n, c] : points) {
      if (!curve.lengths.empty() && n == curve.lengths.back()) throw std::runtime_error("a committed length twice");
      curve.lengths.push_back(n);
      curve.points.push_back(c);
    }
  } catch (const std::exception& e) {
    throw std::invalid_argument(path + ": not a cost curve (" + e.what() + "); write it again with " + fix);
  }
  if (curve.points.empty()) throw std::invalid_argument(path + ": no points; write it again with " + fix);
  curve.file = name;
  for (const Costs& c : curve.points)
    for (int64_t w : keep)
      if (!c.verify.count(w))
        throw std::invalid_argument(path + ": no cost for verify width " + std::to_string(w) + "; write it again with " +
                                    fix + " (the export changed since)");
  return curve;
}

std::string points_json(const CostCurve& curve) {
  std::string out = "\"points\": [";
  for (size_t i = 0; i < curve.points.size(); ++i) {
    const Costs& c = curve.points[i];
    std::string verify;
    for (const auto& [w, ms] : c.verify) verify += (verify.empty() ? "" : ", ") + json::quote(std::to_string(w)) + ": " + json::number(ms);
    out += (i ? ", " : "") + std::string("{\"committed\": ") + std::to_string(curve.lengths[i]) + ", \"verify_ms\": {" +
           verify + "}, \"draft_read_ms\": " + json::number(c.draft) + ", \"commit_ms\": " + json::number(c.commit) + "}";
  }
  return out + "]";
}

Calibration read_calibration(const json::Value* hybrid) {
  Calibration cal;
  if (!hybrid) return cal;
  const int64_t min_rounds = hybrid->at("min_rounds").as_int();
  auto usable = [&](const json::Value& cell) { return cell.at("rounds").as_int() >= min_rounds; };
  if (const json::Value* slots = hybrid->find("slots"))
    for (const auto& table : slots->items) {
      cal.slots.emplace_back();
      for (const auto& cell : table.items) cal.slots.back().push_back(usable(cell) ? cell.at("realised").as_double() : -1.0);
    }
  if (const json::Value* rows = hybrid->find("lookup_slots"))
    for (const auto& row : rows->items) {
      cal.lookup.emplace_back();
      if (usable(row))
        for (const auto& q : row.at("chain").items) cal.lookup.back().push_back(q.as_double());
    }
  return cal;
}

std::vector<double> drafter_chain(const Calibration& cal, const float* confidence, int64_t n) {
  std::vector<double> q(confidence, confidence + n);
  for (int64_t k = 0; k < std::min<int64_t>(n, static_cast<int64_t>(cal.slots.size())); ++k) {
    const std::vector<double>& table = cal.slots[k];
    // the bin of q[k] among the edges 0, 0.1, ..., 1 (numpy's linspace: i * 0.1, the last exactly 1)
    int64_t bin = -1;
    for (int64_t e = 0; e <= 10; ++e)
      if ((e == 10 ? 1.0 : e * 0.1) <= q[k]) bin = e;
    bin = std::clamp<int64_t>(bin, 0, static_cast<int64_t>(table.size()) - 1);
    if (table[bin] >= 0.0) q[k] = table[bin];
  }
  for (int64_t k = 1; k < n; ++k) q[k] = std::min(q[k], q[k - 1]);
  return q;
}

std::vector<double> lookup_chain(const Calibration& cal, int64_t match, int64_t block) {
  if (match < static_cast<int64_t>(cal.lookup.size()) && !cal.lookup[match].empty()) {
    const std::vector<double>& chain = cal.lookup[match];
    return {chain.begin(), chain.begin() + std::min<int64_t>(block, static_cast<int64_t>(chain.size()))};
  }
  return std::vector<double>(block, match ? 1.0 : 0.0);
}

WidthRule::WidthRule(CostCurve curve, int64_t start, bool uses_drafter)
    : curve_(std::move(curve)), uses_drafter_(uses_drafter), expected_(kPriorDrafts), realised_(kPriorDrafts) {
  tokens_ = kPriorRounds;
  ms_ = kPriorRounds * costs(start).verify.at(1);
}

Costs WidthRule::costs(int64_t pos) const {
  Costs c = curve_.at(pos);
  if (!uses_drafter_) c.draft = c.commit = 0.0;  // prompt-lookup: no draft_read, no commits
  return c;
}

bool WidthRule::drafts() {
  if (wait_) {
    --wait_;
    return false;
  }
  return true;
}

int64_t WidthRule::pick(const std::vector<double>& raw, int64_t pos) {
  const Costs c = costs(pos);
  const double scale = realised_ / expected_;
  std::vector<double> cum{1.0};  // E[tokens] at width w: 1 + q_1 + ... + q_{w-1}, the chain corrected
  for (double q : raw) cum.push_back(cum.back() + std::clamp(q * scale, 0.0, 1.0));
  int64_t best = 0;
  double value = 0.0;
  for (const auto& [w, ms] : c.verify) {  // widths ascending: the first of equal values, as numpy's argmax
    const double v = cum[std::min<size_t>(w - 1, cum.size() - 1)] - rate() * (ms + c.commit);
    if (best == 0 || v > value) best = w, value = v;
  }
  if (!uses_drafter_) return best;  // only rounds that ran draft_read judge the drafter
  const double drafted = value - rate() * c.draft;  // this round's value net of the drafter's call
  const int64_t rows = std::min(cooldown_, kMaxFold);  // a rest of this length folds its rows `rows` at a time
  const double plain = 1.0 - rate() * (c.verify.at(1) + c.commit / rows);
  ++streak_;  // the streak's average gain over plain decoding, the last kJudgedRounds or so weighing most
  gain_ += (drafted - plain - gain_) / static_cast<double>(std::min(streak_, kJudgedRounds));
  if (gain_ >= 0.0) {
    cooldown_ = 1;
  } else {  // drafting does not pay on these rounds: rest the drafter, longer each time it still does not pay
    wait_ = cooldown_, rest_commit_rows_ = rows;
    cooldown_ = std::min(2 * cooldown_, kMaxCooldown);
    streak_ = 0, gain_ = 0.0;
  }
  return best;
}

void WidthRule::made_drafted(const std::vector<double>& chain, int64_t width, int accepted, int64_t pos) {
  const Costs c = costs(pos);
  if (!chain.empty() && width > 1) {  // a block without a chain (no confidence head) teaches the correction nothing
    double promised = 0.0;
    for (int64_t k = 0; k < std::min<int64_t>(width - 1, static_cast<int64_t>(chain.size())); ++k) promised += chain[k];
    expected_ += promised;
    realised_ += accepted;
  }
  tokens_ += accepted + 1;
  ms_ += c.verify.at(width) + c.draft + c.commit;
}

void WidthRule::made_rested(int64_t pos) {
  const Costs c = costs(pos);
  tokens_ += 1;
  ms_ += c.verify.at(1) + c.commit / rest_commit_rows_;
}

}  // namespace hyflash
