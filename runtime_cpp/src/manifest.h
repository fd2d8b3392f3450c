// manifest.json: the checks every loader makes (the same as runtime_py/manifest.py's load_manifest),
// and the graph contract read by name (docs/design.md, sections 2 and 3).
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "json.h"

namespace hyflash {

constexpr int kFormatVersion = 4;  // written by this hyflash; it reads 3 too (verify rows one by one)
constexpr int kOldestFormat = 3;
constexpr int kVerifyRows = 8;  // anchor + 7 drafts: the widest verify (target_verify) and every drafter commit's

// The target graph that verifies `width` rows (the anchor and width - 1 drafts); width 1 is a decode step.
std::string verify_graph(int64_t width);

// An export folder that is missing, damaged, or not what it claims (one line: what and the fix).
struct ArtifactError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TensorSpec {
  std::string name, dtype;  // dtype: "float32" | "int64"
  std::vector<int64_t> shape;
  int64_t numel() const;
};

struct GraphSpec {
  std::string model;                 // "drafter" | "target"
  std::string pte_file, pte_method;  // empty when the graph was not exported to .pte
  std::vector<TensorSpec> inputs, outputs;
  const TensorSpec& io(const std::string& name) const;  // throws ArtifactError
  bool has(const std::string& name) const;
};

struct Manifest {
  std::string folder;
  json::Value raw;
  std::map<std::string, GraphSpec> graphs;
  int64_t block = 0, window = 0, max_context = 0, prefill_chunk = 0, vocab = 0;
  bool has_memory = false;
  std::vector<int64_t> eos;  // generation.eos_token_ids, else target.config.eos_token_id
  std::vector<int64_t> verify_widths;  // 2..8, sorted, 8 among them: target_verify_{w} (target_verify for 8)
  std::string drafter_name;
  // cache.pte.verify_attention: "block" (a verify block attends in one custom_sdpa call: its rows are the
  // decode steps' with the project's kernels only) or "rows" (one call per row; exports before the field)
  std::string pte_verify_attention = "rows";

  const GraphSpec& graph(const std::string& name) const;
  int64_t usable_context() const { return max_context - kVerifyRows; }
};

// Reads and checks folder/manifest.json: format version, its own checksum, required keys, paths
// inside the folder, the sizes agreeing with each other, and the sha256 of every listed file.
Manifest load_manifest(const std::string& folder);

}  // namespace hyflash
