#include "manifest.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "sha256.h"

namespace hyflash {
namespace fs = std::filesystem;
namespace {

const char* const kRequired[] = {"format_version", "graphs", "files", "target", "drafter", "block", "window",
                                 "max_context", "prefill_chunk", "verify_widths", "cache", "quantization", "memory",
                                 "versions"};
const char* const kTargetGraphs[] = {"target_prefill", "target_verify", "target_decode"};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string show(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

std::vector<int64_t> ints(const json::Value& list) {
  std::vector<int64_t> out;
  for (const auto& x : list.items) out.push_back(x.as_int());
  return out;
}

// folder/rel, refusing absolute paths and anything that resolves outside the folder.
fs::path inside(const fs::path& folder, const json::Value& rel_value, const std::string& where) {
  if (!rel_value.is_string() || rel_value.text.empty() || fs::path(rel_value.text).is_absolute())
    throw ArtifactError(where + ": file path " + json::canonical(rel_value) + " is not a relative path");
  fs::path root = fs::weakly_canonical(folder), path = fs::weakly_canonical(folder / rel_value.text);
  auto [r, p] = std::mismatch(root.begin(), root.end(), path.begin(), path.end());
  if (r != root.end())
    throw ArtifactError(where + ": file path " + json::quote(rel_value.text) + " points outside the export folder");
  return path;
}

TensorSpec tensor(const json::Value& v) {
  return {v.at("name").as_string(), v.at("dtype").as_string(), ints(v.at("shape"))};
}

class Checker {
 public:
  Checker(const std::string& path, const Manifest& m) : path_(path), m_(m) {}

  template <typename A, typename B>
  void same(const std::string& field, const A& value, const std::string& other, const B& expected) const {
    if (value != expected)
      throw ArtifactError(path_ + ": " + field + " is " + str(value) + " but " + other + " is " + str(expected) +
                          "; the manifest does not describe this export: re-export");
  }

  std::vector<int64_t> shape(const std::string& graph, const std::string& name) const {
    const GraphSpec& g = m_.graph(graph);
    for (const auto* list : {&g.inputs, &g.outputs})
      for (const auto& t : *list)
        if (t.name == name) return t.shape;
    throw ArtifactError(path_ + ": graph '" + graph + "' has no tensor '" + name + "'; re-export");
  }

 private:
  std::string path_;
  const Manifest& m_;
  static std::string str(int64_t v) { return std::to_string(v); }
  static std::string str(const std::vector<int64_t>& v) { return show(v); }
};

// The sizes the manifest states agree with each other and with the configs it records
// (runtime_py/manifest.py check_consistency, the same fields in the same order).
void check_consistency(const std::string& path, const Manifest& m) {
  const json::Value& raw = m.raw;
  const json::Value &cache = raw.at("cache"), &target = raw.at("target").at("config");
  const json::Value& drafter = raw.at("drafter").at("config");
  for (const char* name : {"target_prefill", "target_verify", "target_decode", "draft_read", "window_shift"})
    if (!m.graphs.count(name)) throw ArtifactError(path + ": graph '" + name + "' is missing; re-export");
  for (const auto& [name, g] : m.graphs)
    for (const auto* list : {&g.inputs, &g.outputs})
      for (const auto& t : *list)
        if (t.dtype == "float16")
          throw ArtifactError(path + ": an fp16 export (graphs." + name + " tensor '" + t.name +
                              "'); hyflash-run runs fp32 exports only: export with --dtype fp32, or run this one "
                              "with hyflash generate");
        else if (t.dtype != "float32" && t.dtype != "int64")
          throw ArtifactError(path + ": graphs." + name + " tensor '" + t.name + "' has dtype '" + t.dtype +
                              "'; expected float32 or int64: re-export");
  Checker c(path, m);
  int64_t t_max = m.max_context, rows = cache.at("rows").as_int(), kvh = cache.at("kv_heads").as_int();
  int64_t hd = cache.at("head_dim").as_int();
  c.same("max_context", t_max, "cache.rows", rows);
  c.same("cache.onnx.shape", ints(cache.at("onnx").at("shape")), "[1, kv_heads, rows, head_dim]",
         std::vector<int64_t>{1, kvh, rows, hd});
  c.same("cache.pte.shape", ints(cache.at("pte").at("shape")), "[1, rows, kv_heads, head_dim]",
         std::vector<int64_t>{1, rows, kvh, hd});
  if (m.pte_verify_attention != "block" && m.pte_verify_attention != "rows")
    throw ArtifactError(path + ": cache.pte.verify_attention is not block or rows: re-export");
  c.same("cache.layers", cache.at("layers").as_int(), "target.config.num_hidden_layers",
         target.at("num_hidden_layers").as_int());
  c.same("block", m.block, "drafter.config.block", drafter.at("block").as_int());
  c.same("block", m.block, "draft_read.draft_tokens shape[0]", c.shape("draft_read", "draft_tokens").at(0));
  c.same("block + 1", m.block + 1, "the verify width", int64_t{kVerifyRows});
  if (m.graph("draft_read").has("lookup_tokens")) {  // a lookup-input drafter: the runner fills both
    c.same("draft_read.lookup_tokens shape", c.shape("draft_read", "lookup_tokens"), "[block]",
           std::vector<int64_t>{m.block});
    c.same("draft_read.lookup_match shape", c.shape("draft_read", "lookup_match"), "[1]", std::vector<int64_t>{1});
  }
  c.same("window", m.window, "window_shift.win_pos shape[0]", c.shape("window_shift", "win_pos").at(0));
  c.same("window", m.window, "draft_read.win_k shape[2]", c.shape("draft_read", "win_k").at(2));
  const json::Value& window = drafter.at("window");
  int64_t expected_window = window.is_string() && window.text == "full" ? t_max : std::min(window.as_int(), t_max);
  c.same("window", m.window, "drafter.config.window (at max_context)", expected_window);
  c.same("prefill_chunk", m.prefill_chunk, "target_prefill.tokens shape[0]",
         c.shape("target_prefill", "tokens").at(0));
  const std::vector<int64_t>& widths = m.verify_widths;
  bool ordered = !widths.empty() && widths.front() >= 2 && widths.back() == kVerifyRows;
  for (size_t i = 1; i < widths.size(); ++i) ordered = ordered && widths[i - 1] < widths[i];
  if (!ordered)
    throw ArtifactError(path + ": verify_widths " + show(widths) + " must be sorted, distinct, in 2.." +
                        std::to_string(kVerifyRows) + " and include " + std::to_string(kVerifyRows) + "; re-export");
  std::vector<std::string> target_graphs(std::begin(kTargetGraphs), std::end(kTargetGraphs));
  for (int64_t w : widths) {
    if (!m.graphs.count(verify_graph(w)))
      throw ArtifactError(path + ": graph '" + verify_graph(w) + "' (verify width " + std::to_string(w) +
                          ") is missing; re-export");
    c.same(verify_graph(w) + ".tokens shape[0]", c.shape(verify_graph(w), "tokens").at(0), "its verify width", w);
    if (w != kVerifyRows) target_graphs.push_back(verify_graph(w));
  }
  c.same("target_decode.tokens shape[0]", c.shape("target_decode", "tokens").at(0), "the decode width", int64_t{1});
  int64_t feature = static_cast<int64_t>(raw.at("target").at("taps").size()) * target.at("hidden_size").as_int();
  int64_t vocab = target.at("vocab_size").as_int();
  for (const std::string& name : target_graphs) {
    int64_t n = c.shape(name, "tokens").at(0);
    std::string g = name;
    c.same(g + ".positions shape", c.shape(name, "positions"), "[tokens]", std::vector<int64_t>{n});
    c.same(g + ".logits shape", c.shape(name, "logits"), "[tokens, target.config.vocab_size]",
           std::vector<int64_t>{n, vocab});
    c.same(g + ".features shape", c.shape(name, "features"), "[tokens, taps x hidden_size]",
           std::vector<int64_t>{n, feature});
  }
  const json::Value* dv = drafter.find("draft_vocab");
  int64_t draft_vocab = dv && dv->is_int() && dv->as_int() ? dv->as_int() : vocab;
  c.same("draft_read.draft_logits shape", c.shape("draft_read", "draft_logits"),
         "[block, drafter.config.draft_vocab or vocab_size]", std::vector<int64_t>{m.block, draft_vocab});
  c.same("window_shift.features shape", c.shape("window_shift", "features"), "[8, taps x hidden_size]",
         std::vector<int64_t>{kVerifyRows, feature});
  if (t_max <= kVerifyRows)
    throw ArtifactError(path + ": max_context " + std::to_string(t_max) + " leaves no usable context (needs > " +
                        std::to_string(kVerifyRows) + "); re-export");
}

void read_contract(Manifest& m) {
  const json::Value& raw = m.raw;
  for (const auto& [name, g] : raw.at("graphs").members) {
    GraphSpec spec;
    spec.model = g.at("model").as_string();
    if (const json::Value* pte = g.find("pte"); pte && pte->is_object()) {
      spec.pte_file = pte->at("file").as_string();
      spec.pte_method = pte->at("method").as_string();
    }
    for (const auto& t : g.at("inputs").items) spec.inputs.push_back(tensor(t));
    for (const auto& t : g.at("outputs").items) spec.outputs.push_back(tensor(t));
    m.graphs[name] = spec;
  }
  m.block = raw.at("block").as_int();
  m.window = raw.at("window").as_int();
  m.max_context = raw.at("max_context").as_int();
  m.prefill_chunk = raw.at("prefill_chunk").as_int();
  m.verify_widths = ints(raw.at("verify_widths"));
  m.has_memory = m.graphs.count("state_commit") > 0;
  m.drafter_name = raw.at("drafter").at("name").as_string();
  if (const json::Value* how = raw.at("cache").at("pte").find("verify_attention"))  // absent: "rows"
    m.pte_verify_attention = how->is_string() ? how->text : "";
  const json::Value* generation = raw.find("generation");  // exports before it: config.json's EOS only
  const json::Value* eos = generation && generation->find("eos_token_ids") ? generation->find("eos_token_ids")
                                                                           : raw.at("target").at("config").find("eos_token_id");
  if (eos && eos->is_array()) m.eos = ints(*eos);
  else if (eos && eos->is_int()) m.eos = {eos->as_int()};
}

}  // namespace

std::string verify_graph(int64_t width) {
  if (width == 1) return "target_decode";
  return width == kVerifyRows ? "target_verify" : "target_verify_" + std::to_string(width);
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const TensorSpec& GraphSpec::io(const std::string& name) const {
  for (const auto* list : {&inputs, &outputs})
    for (const auto& t : *list)
      if (t.name == name) return t;
  throw ArtifactError("the graph has no input or output '" + name + "'; re-export");
}

bool GraphSpec::has(const std::string& name) const {
  for (const auto* list : {&inputs, &outputs})
    for (const auto& t : *list)
      if (t.name == name) return true;
  return false;
}

const GraphSpec& Manifest::graph(const std::string& name) const {
  auto it = graphs.find(name);
  if (it == graphs.end()) throw ArtifactError(folder + ": the export has no graph '" + name + "'; re-export");
  return it->second;
}

Manifest load_manifest(const std::string& folder_arg) {
  fs::path folder(folder_arg), path = folder / "manifest.json";
  std::string where = path.string();
  if (!fs::is_directory(folder))
    throw ArtifactError(folder_arg + ": not a folder; pass an export folder written by `hyflash export`");
  if (!fs::is_regular_file(path))
    throw ArtifactError(folder_arg + ": no manifest.json; pass an export folder written by `hyflash export`");
  Manifest m;
  m.folder = folder_arg;
  try {
    m.raw = json::parse(read_file(path));
  } catch (const std::runtime_error& e) {
    throw ArtifactError(where + ": " + e.what() + "; re-export");
  }
  if (!m.raw.is_object()) throw ArtifactError(where + ": not a JSON object; re-export");
  const json::Value* version = m.raw.find("format_version");
  if (!version || !version->is_int() || version->as_int() < kOldestFormat || version->as_int() > kFormatVersion)
    throw ArtifactError(where + ": format_version " + (version ? json::canonical(*version) : "None") +
                        " is not supported (this hyflash reads 3 and 4); re-export it with this version of hyflash");
  const json::Value* recorded = m.raw.find("manifest_sha256");
  if (!recorded || !recorded->is_string() || recorded->text != sha256_hex(json::canonical(m.raw, "manifest_sha256")))
    throw ArtifactError(where + ": the manifest's own checksum (manifest_sha256) does not match its contents; "
                        "it was edited after export: re-export");
  for (const char* key : kRequired)
    if (!m.raw.find(key)) throw ArtifactError(where + ": missing key '" + std::string(key) + "'; re-export");
  const json::Value &files = m.raw.at("files"), &graphs = m.raw.at("graphs");
  if (!files.is_object() || !graphs.is_object())
    throw ArtifactError(where + ": 'files' and 'graphs' must be objects; re-export");
  for (const auto& [name, g] : graphs.members) {
    const json::Value* pte = g.find("pte");
    if (!g.is_object() || (pte && pte->kind != json::Value::Kind::Null && !pte->is_object()))
      throw ArtifactError(where + ": graph '" + name + "' must be an object (its 'pte' too); re-export");
    std::vector<const json::Value*> refs = {g.find("onnx"), pte && pte->is_object() ? pte->find("file") : nullptr};
    for (const json::Value* rel : refs) {
      if (!rel || rel->kind == json::Value::Kind::Null) continue;
      inside(folder, *rel, where);
      if (!files.find(rel->text))
        throw ArtifactError(where + ": graph '" + name + "' uses '" + rel->text + "', which has no checksum; re-export");
    }
  }
  try {
    read_contract(m);
    check_consistency(where, m);
    m.vocab = m.graphs.at("target_decode").io("logits").shape.at(1);
  } catch (const ArtifactError&) {
    throw;
  } catch (const std::exception& e) {
    throw ArtifactError(where + ": malformed entry (" + e.what() + "); re-export");
  }
  for (const auto& [rel, expected] : files.members) {  // every file checked before anything is used
    fs::path file = inside(folder, json::Value{json::Value::Kind::String, false, rel, {}, {}}, where);
    if (!fs::is_regular_file(file))
      throw ArtifactError(file.string() + ": missing from the export (listed in manifest.json); re-export");
    std::string actual = sha256_file(file.string());
    if (!expected.is_string() || actual != expected.text)
      throw ArtifactError(file.string() + ": sha256 " + actual.substr(0, 16) + "... does not match the manifest's " +
                          (expected.is_string() ? expected.text.substr(0, 16) : std::string("?")) +
                          "...; the file was changed after export: re-export");
  }
  return m;
}

}  // namespace hyflash
