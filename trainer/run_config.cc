#include "trainer/run_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/exec.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

using json = nlohmann::json;

absl::Status bad(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("run config: ", absl_sv(field), ": ", absl_sv(why)));
}

// Every key of `obj` must be one of `known`.
absl::Status only_keys(const json& obj, std::string_view where,
                       const std::set<std::string>& known) {
  if (!obj.is_object()) return bad(where, "must be an object");
  for (const auto& [key, value] : obj.items())
    if (!known.contains(key)) return bad(absl::StrCat(absl_sv(where), ".", key), "unknown field");
  return absl::OkStatus();
}

template <typename T>
absl::Status read(const json& obj, const char* key, std::string_view where, T& out) {
  if (!obj.contains(key)) return absl::OkStatus();
  const json& v = obj[key];
  const std::string field = absl::StrCat(absl_sv(where), ".", key);
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) return bad(field, "must be a string");
    out = v.get<std::string>();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) return bad(field, "must be true or false");
    out = v.get<bool>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) return bad(field, "must be a number");
    out = v.get<T>();
  } else {
    if (!v.is_number_integer()) return bad(field, "must be an integer");
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return bad(field, "out of range");
    const int64_t x = v.get<int64_t>();
    const bool fits = std::is_unsigned_v<T>
                          ? x >= 0 && static_cast<uint64_t>(x) <=
                                          static_cast<uint64_t>(std::numeric_limits<T>::max())
                          : x >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                                x <= static_cast<int64_t>(std::numeric_limits<T>::max());
    if (!fits) return bad(field, "out of range");
    out = static_cast<T>(x);
  }
  return absl::OkStatus();
}

// The "model" section both configs share: exactly one of a model config (with a seed for its
// synthetic weights) and a checkpoint. `where`: the config's name ("run", "rl").
absl::Status read_model(const json& j, std::string_view where, std::string& config, uint64_t& seed,
                        std::string& checkpoint) {
  if (!j.contains("model")) return bad(absl::StrCat(absl_sv(where), ".model"), "required");
  const json& m = j["model"];
  LOOM_RETURN_IF_ERROR(only_keys(m, "model", {"config", "seed", "checkpoint"}));
  LOOM_RETURN_IF_ERROR(read(m, "config", "model", config));
  LOOM_RETURN_IF_ERROR(read(m, "seed", "model", seed));
  LOOM_RETURN_IF_ERROR(read(m, "checkpoint", "model", checkpoint));
  if (config.empty() == checkpoint.empty())
    return bad("model", "give exactly one of config and checkpoint");
  return absl::OkStatus();
}

// A config file's text, for either parser.
absl::StatusOr<std::string> read_config_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("run config: cannot read ", path));
  std::ostringstream text;
  text << f.rdbuf();
  return text.str();
}

absl::Status read_mqar(const json& q, std::string_view where, MqarOptions& m) {
  LOOM_RETURN_IF_ERROR(only_keys(q, where,
                                 {"num_pairs", "min_pairs", "key_begin", "num_keys", "value_begin",
                                  "num_values", "pad_id", "spread"}));
  LOOM_RETURN_IF_ERROR(read(q, "num_pairs", where, m.num_pairs));
  LOOM_RETURN_IF_ERROR(read(q, "min_pairs", where, m.min_pairs));
  LOOM_RETURN_IF_ERROR(read(q, "key_begin", where, m.key_begin));
  LOOM_RETURN_IF_ERROR(read(q, "num_keys", where, m.num_keys));
  LOOM_RETURN_IF_ERROR(read(q, "value_begin", where, m.value_begin));
  LOOM_RETURN_IF_ERROR(read(q, "num_values", where, m.num_values));
  LOOM_RETURN_IF_ERROR(read(q, "pad_id", where, m.pad_id));
  LOOM_RETURN_IF_ERROR(read(q, "spread", where, m.spread));
  return absl::OkStatus();
}

absl::Status read_tool_dialogue(const json& q, std::string_view where, ToolDialogueOptions& t) {
  LOOM_RETURN_IF_ERROR(only_keys(q, where, {"max_turns", "max_operand", "registry_size"}));
  LOOM_RETURN_IF_ERROR(read(q, "max_turns", where, t.max_turns));
  LOOM_RETURN_IF_ERROR(read(q, "max_operand", where, t.max_operand));
  LOOM_RETURN_IF_ERROR(read(q, "registry_size", where, t.registry_size));
  const absl::Status ok = t.validate();
  if (!ok.ok()) return bad(where, std::string(ok.message()));
  return absl::OkStatus();
}

absl::Status read_passkey(const json& q, std::string_view where, int64_t seq_len,
                          PasskeyTrainOptions& o) {
  LOOM_RETURN_IF_ERROR(only_keys(q, where, {"min_context", "digits"}));
  LOOM_RETURN_IF_ERROR(read(q, "min_context", where, o.min_context));
  LOOM_RETURN_IF_ERROR(read(q, "digits", where, o.digits));
  const absl::Status ok = o.validate(seq_len);
  if (!ok.ok()) return bad(where, std::string(ok.message()));
  return absl::OkStatus();
}

// "mix": [{"task": NAME, "weight": W}, ...]: synthetic tasks only (shards are not drawn per
// example), each at most once, weights finite and > 0.
absl::Status read_mix(const json& d, std::vector<TaskWeight>& mix) {
  if (!d.contains("mix")) return bad("data.mix", "required for data.task mix");
  const json& list = d["mix"];
  if (!list.is_array() || list.empty() || list.size() > 3)
    return bad("data.mix", "must be a list of 1 to 3 {\"task\", \"weight\"} entries");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = absl::StrCat("data.mix[", i, "]");
    LOOM_RETURN_IF_ERROR(only_keys(list[i], where, {"task", "weight"}));
    TaskWeight t;
    if (!list[i].contains("task")) return bad(where + ".task", "required");
    LOOM_RETURN_IF_ERROR(read(list[i], "task", where, t.task));
    LOOM_RETURN_IF_ERROR(read(list[i], "weight", where, t.weight));
    if (t.task != "mqar" && t.task != "passkey" && t.task != "tool_dialogue")
      return bad(where + ".task", absl::StrCat("'", t.task, "' (mqar, passkey or tool_dialogue)"));
    if (!std::isfinite(t.weight) || !(t.weight > 0) || t.weight > 1e6)
      return bad(where + ".weight", absl::StrCat(t.weight, " is outside (0, 1e6]"));
    for (const TaskWeight& other : mix)
      if (other.task == t.task) return bad(where + ".task", absl::StrCat("'", t.task, "' twice"));
    mix.push_back(t);
  }
  return absl::OkStatus();
}

// A number that must be finite and within [lo, hi].
absl::Status in_range(const std::string& field, double x, double lo, double hi) {
  if (!std::isfinite(x) || x < lo || x > hi)
    return bad(field, absl::StrCat(x, " is outside [", lo, ", ", hi, "]"));
  return absl::OkStatus();
}

// "balance": {"method", "enabled", "eta", "q_low", "q_high", "aux_alpha"} and "routing_warnings":
// {"min_entropy", "max_violation", "max_idle_fraction"}. A method's options are refused with
// another method, so that a run cannot silently ignore them.
absl::Status read_balance(const json& j, OptimizerOptions& opt) {
  QuantileBalancerOptions& b = opt.balancer;
  if (j.contains("balance")) {
    const json& o = j["balance"];
    LOOM_RETURN_IF_ERROR(
        only_keys(o, "balance", {"method", "enabled", "eta", "q_low", "q_high", "aux_alpha"}));
    if (o.contains("method") && o.contains("enabled"))
      return bad("balance.enabled", "give balance.method or balance.enabled, not both");
    if (o.contains("method")) {
      std::string name;
      LOOM_RETURN_IF_ERROR(read(o, "method", "balance", name));
      auto m = parse_balance_method(name);
      if (!m.ok()) return bad("balance.method", std::string(m.status().message()));
      opt.balance = *m;
    }
    if (o.contains("enabled")) {  // the spelling before balance.method: false is "none"
      if (!o["enabled"].is_boolean()) return bad("balance.enabled", "must be true or false");
      opt.balance = o["enabled"].get<bool>() ? BalanceMethod::kQuantile : BalanceMethod::kNone;
    }
    for (const char* key : {"eta", "q_low", "q_high"})
      if (o.contains(key) && opt.balance != BalanceMethod::kQuantile)
        return bad(absl::StrCat("balance.", key), "only for balance.method quantile");
    if (o.contains("aux_alpha") && opt.balance != BalanceMethod::kAuxLoss)
      return bad("balance.aux_alpha", "only for balance.method aux_loss");
    LOOM_RETURN_IF_ERROR(read(o, "aux_alpha", "balance", opt.aux_loss_alpha));
    if (!(opt.aux_loss_alpha > 0 && opt.aux_loss_alpha <= 1e3))
      return bad("balance.aux_alpha", absl::StrCat(opt.aux_loss_alpha, " is outside (0, 1e3]"));
    LOOM_RETURN_IF_ERROR(read(o, "eta", "balance", b.eta));
    LOOM_RETURN_IF_ERROR(read(o, "q_low", "balance", b.q_low));
    LOOM_RETURN_IF_ERROR(read(o, "q_high", "balance", b.q_high));
    LOOM_RETURN_IF_ERROR(in_range("balance.eta", b.eta, 0, 1e3));
    LOOM_RETURN_IF_ERROR(in_range("balance.q_low", b.q_low, 0, 1));
    LOOM_RETURN_IF_ERROR(in_range("balance.q_high", b.q_high, 0, 1));
    if (b.q_low > b.q_high) return bad("balance.q_low", "must be <= balance.q_high");
  }
  if (j.contains("routing_warnings")) {
    const json& o = j["routing_warnings"];
    LOOM_RETURN_IF_ERROR(
        only_keys(o, "routing_warnings", {"min_entropy", "max_violation", "max_idle_fraction"}));
    LOOM_RETURN_IF_ERROR(read(o, "min_entropy", "routing_warnings", b.warn_min_entropy));
    LOOM_RETURN_IF_ERROR(read(o, "max_violation", "routing_warnings", b.warn_max_violation));
    LOOM_RETURN_IF_ERROR(
        read(o, "max_idle_fraction", "routing_warnings", b.warn_max_idle_fraction));
    LOOM_RETURN_IF_ERROR(in_range("routing_warnings.min_entropy", b.warn_min_entropy, 0, 1));
    LOOM_RETURN_IF_ERROR(in_range("routing_warnings.max_violation", b.warn_max_violation, 0, 1e9));
    LOOM_RETURN_IF_ERROR(
        in_range("routing_warnings.max_idle_fraction", b.warn_max_idle_fraction, 0, 1));
  }
  return absl::OkStatus();
}

// A stage's "mix": [{"task", "weight"}, ...] over data.mix's tasks: each listed at most once,
// weights in [0, 1e6] (a task left out weighs 0), at least one above 0. Into weights, in data.mix's
// order.
absl::Status read_stage_mix(const json& list, const std::string& where,
                            const std::vector<TaskWeight>& run_mix, std::vector<double>& weights) {
  if (run_mix.empty()) return bad(where, "only for data.task mix");
  if (!list.is_array() || list.empty() || list.size() > run_mix.size())
    return bad(where, absl::StrCat("must be a list of 1 to ", run_mix.size(),
                                   " {\"task\", \"weight\"} entries over data.mix's tasks"));
  weights.assign(run_mix.size(), 0.0);
  std::vector<bool> seen(run_mix.size(), false);
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = absl::StrCat(where, "[", i, "]");
    LOOM_RETURN_IF_ERROR(only_keys(list[i], at, {"task", "weight"}));
    if (!list[i].contains("task")) return bad(at + ".task", "required");
    if (!list[i].contains("weight")) return bad(at + ".weight", "required");
    std::string task;
    double weight = 0;
    LOOM_RETURN_IF_ERROR(read(list[i], "task", at, task));
    LOOM_RETURN_IF_ERROR(read(list[i], "weight", at, weight));
    size_t k = 0;
    while (k < run_mix.size() && run_mix[k].task != task) ++k;
    if (k == run_mix.size())
      return bad(at + ".task", absl::StrCat("'", task, "' is not in data.mix"));
    if (seen[k]) return bad(at + ".task", absl::StrCat("'", task, "' twice"));
    if (!std::isfinite(weight) || weight < 0 || weight > 1e6)
      return bad(at + ".weight", absl::StrCat(weight, " is outside [0, 1e6]"));
    seen[k] = true;
    weights[k] = weight;
  }
  bool any = false;
  for (double w : weights) any = any || w > 0;
  if (!any) return bad(where, "every weight is 0: the stage would draw no examples");
  return absl::OkStatus();
}

// "stages": [{"seq_len", "rope_theta", "min_steps", "max_steps", "target_loss", "mqar",
// "tool_dialogue", "passkey", "mix"}, ...] and
// "stage_stability": {"window", "tolerance"}.
absl::Status read_stages(const json& j, RunConfig& c) {
  if (j.contains("stage_stability")) {
    const json& o = j["stage_stability"];
    LOOM_RETURN_IF_ERROR(only_keys(o, "stage_stability", {"window", "tolerance"}));
    LOOM_RETURN_IF_ERROR(read(o, "window", "stage_stability", c.stage_stability.window));
    LOOM_RETURN_IF_ERROR(read(o, "tolerance", "stage_stability", c.stage_stability.tolerance));
    if (c.stage_stability.window < 1 || c.stage_stability.window > 100000)
      return bad("stage_stability.window", "must be in [1, 100000]");
    LOOM_RETURN_IF_ERROR(
        in_range("stage_stability.tolerance", c.stage_stability.tolerance, 0, 1e9));
  }
  if (!j.contains("stages")) return absl::OkStatus();
  const json& list = j["stages"];
  if (!list.is_array() || list.empty() || list.size() > 64)
    return bad("run.stages", "must be a list of 1 to 64 stages");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = absl::StrCat("stages[", i, "]");
    const json& o = list[i];
    LOOM_RETURN_IF_ERROR(only_keys(o, where,
                                   {"seq_len", "rope_theta", "min_steps", "max_steps",
                                    "target_loss", "mqar", "tool_dialogue", "passkey", "mix"}));
    StageConfig s;
    if (!o.contains("seq_len")) return bad(where + ".seq_len", "required");
    if (!o.contains("max_steps")) return bad(where + ".max_steps", "required");
    LOOM_RETURN_IF_ERROR(read(o, "seq_len", where, s.seq_len));
    LOOM_RETURN_IF_ERROR(read(o, "rope_theta", where, s.rope_theta));
    LOOM_RETURN_IF_ERROR(read(o, "min_steps", where, s.min_steps));
    LOOM_RETURN_IF_ERROR(read(o, "max_steps", where, s.max_steps));
    LOOM_RETURN_IF_ERROR(read(o, "target_loss", where, s.target_loss));
    if (o.contains("target_loss"))
      LOOM_RETURN_IF_ERROR(in_range(where + ".target_loss", s.target_loss, 1e-9, 1e6));
    if (s.seq_len < 2 || s.seq_len > (1 << 20))
      return bad(where + ".seq_len", "must be in [2, 2^20]");
    if (o.contains("rope_theta"))
      LOOM_RETURN_IF_ERROR(in_range(where + ".rope_theta", s.rope_theta, 1.0, 1e12));
    if (s.max_steps < 1 || s.max_steps > (int64_t{1} << 40))
      return bad(where + ".max_steps", "must be in [1, 2^40]");
    if (s.min_steps < 0 || s.min_steps > s.max_steps)
      return bad(where + ".min_steps", "must be in [0, max_steps]");
    if (run_uses_task(c, "mqar")) {
      s.mqar = c.mqar;
      if (o.contains("mqar")) LOOM_RETURN_IF_ERROR(read_mqar(o["mqar"], where + ".mqar", s.mqar));
      s.mqar.seq_len = s.seq_len;
      const absl::Status ok = s.mqar.validate();
      if (!ok.ok()) return bad(where + ".mqar", std::string(ok.message()));
    } else if (o.contains("mqar")) {
      return bad(where + ".mqar", "only for data.task mqar (or a mix with it)");
    }
    s.tool_dialogue = c.tool_dialogue;
    if (o.contains("tool_dialogue")) {
      if (!run_uses_task(c, "tool_dialogue"))
        return bad(where + ".tool_dialogue", "only for data.task tool_dialogue (or a mix with it)");
      LOOM_RETURN_IF_ERROR(
          read_tool_dialogue(o["tool_dialogue"], where + ".tool_dialogue", s.tool_dialogue));
    }
    s.passkey = c.passkey;
    if (o.contains("passkey") && !run_uses_task(c, "passkey"))
      return bad(where + ".passkey", "only for data.task passkey (or a mix with it)");
    if (run_uses_task(c, "passkey")) {
      if (o.contains("passkey")) {
        LOOM_RETURN_IF_ERROR(read_passkey(o["passkey"], where + ".passkey", s.seq_len, s.passkey));
      } else {
        const absl::Status ok = s.passkey.validate(s.seq_len);
        if (!ok.ok()) return bad(where + ".passkey", std::string(ok.message()));
      }
    }
    if (o.contains("mix"))
      LOOM_RETURN_IF_ERROR(read_stage_mix(o["mix"], where + ".mix", c.mix, s.mix_weights));
    c.stages.push_back(s);
  }
  return absl::OkStatus();
}

// "optimizer": {"peak_lr", "min_lr", "warmup_steps", "total_steps", "beta1", "beta2", "eps",
// "weight_decay", "clip_norm"} of a run of `steps` steps.
absl::Status read_optimizer(const json& j, int64_t steps, OptimizerOptions& opt) {
  opt.lr.total_steps = steps;
  // Unless given, warmup is a tenth of the run (at most the schedule's default).
  opt.lr.warmup_steps = std::min(opt.lr.warmup_steps, steps / 10);
  if (j.contains("optimizer")) {
    const json& o = j["optimizer"];
    LOOM_RETURN_IF_ERROR(only_keys(o, "optimizer",
                                   {"peak_lr", "min_lr", "warmup_steps", "total_steps", "beta1",
                                    "beta2", "eps", "weight_decay", "clip_norm"}));
    LOOM_RETURN_IF_ERROR(read(o, "peak_lr", "optimizer", opt.lr.peak_lr));
    LOOM_RETURN_IF_ERROR(read(o, "min_lr", "optimizer", opt.lr.min_lr));
    LOOM_RETURN_IF_ERROR(read(o, "warmup_steps", "optimizer", opt.lr.warmup_steps));
    LOOM_RETURN_IF_ERROR(read(o, "total_steps", "optimizer", opt.lr.total_steps));
    LOOM_RETURN_IF_ERROR(read(o, "beta1", "optimizer", opt.beta1));
    LOOM_RETURN_IF_ERROR(read(o, "beta2", "optimizer", opt.beta2));
    LOOM_RETURN_IF_ERROR(read(o, "eps", "optimizer", opt.eps));
    LOOM_RETURN_IF_ERROR(read(o, "weight_decay", "optimizer", opt.weight_decay));
    LOOM_RETURN_IF_ERROR(read(o, "clip_norm", "optimizer", opt.clip_norm));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RunConfig> parse_run_config(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("run config: not valid JSON");
  LOOM_RETURN_IF_ERROR(
      only_keys(j, "run",
                {"model", "data", "batch_size", "steps", "optimizer", "out", "checkpoint_every",
                 "seed", "balance", "routing_warnings", "stages", "stage_stability", "loss_bucket",
                 "device", "max_tokens_per_pass", "matmul", "data_parallel"}));
  RunConfig c;
  LOOM_RETURN_IF_ERROR(read_model(j, "run", c.model_config, c.model_seed, c.model_checkpoint));
  std::string device = "cpu";
  LOOM_RETURN_IF_ERROR(read(j, "device", "run", device));
  absl::StatusOr<Device> parsed = parse_device(device);
  if (!parsed.ok()) return bad("run.device", std::string(parsed.status().message()));
  c.device = *parsed;
  std::string matmul = "f32";
  LOOM_RETURN_IF_ERROR(read(j, "matmul", "run", matmul));
  if (matmul == "tf32" || matmul == "bf16") {
    if (c.device.is_cpu())
      return bad("run.matmul", absl::StrCat("\"", matmul, "\" needs a CUDA device (run.device)"));
    c.matmul = matmul == "tf32" ? MatmulPrecision::kTf32 : MatmulPrecision::kBf16;
  } else if (matmul != "f32") {
    return bad("run.matmul", "must be \"f32\", \"tf32\" or \"bf16\"");
  }

  if (!j.contains("data")) return bad("run.data", "required");
  const json& d = j["data"];
  LOOM_RETURN_IF_ERROR(only_keys(d, "data",
                                 {"task", "mqar", "tool_dialogue", "passkey", "mix", "tokenizer",
                                  "shards", "seq_len", "loss"}));
  LOOM_RETURN_IF_ERROR(read(d, "task", "data", c.task));
  std::string loss = "answers";
  LOOM_RETURN_IF_ERROR(read(d, "loss", "data", loss));
  if (loss != "answers" && loss != "all")
    return bad("data.loss", absl::StrCat("'", loss, "' (answers or all)"));
  c.score_all_tokens = loss == "all";
  if (c.task != "mqar" && c.task != "passkey" && c.task != "tool_dialogue" && c.task != "mix" &&
      c.task != "shards")
    return bad("data.task",
               absl::StrCat("'", c.task, "' (mqar, passkey, tool_dialogue, mix or shards)"));
  LOOM_RETURN_IF_ERROR(read(d, "seq_len", "data", c.seq_len));
  if (c.seq_len < 2 || c.seq_len > (1 << 20)) return bad("data.seq_len", "must be in [2, 2^20]");
  if (c.task == "mix") {
    LOOM_RETURN_IF_ERROR(read_mix(d, c.mix));
  } else if (d.contains("mix")) {
    return bad("data.mix", "only for data.task mix");
  }
  // Each task's own fields are refused where the run does not draw that task, so a misplaced one
  // cannot go unread.
  for (const char* task : {"mqar", "tool_dialogue", "passkey"})
    if (d.contains(task) && !run_uses_task(c, task))
      return bad(absl::StrCat("data.", task),
                 absl::StrCat("only for data.task ", task, " (or a mix with it)"));
  const bool tokenized = run_uses_task(c, "tool_dialogue") || run_uses_task(c, "passkey");
  if (d.contains("tokenizer") && !tokenized)
    return bad("data.tokenizer", "only for data.task tool_dialogue or passkey (or a mix with one)");
  if (d.contains("shards") && c.task != "shards")
    return bad("data.shards", "only for data.task shards");
  if (run_uses_task(c, "mqar")) {
    if (d.contains("mqar")) LOOM_RETURN_IF_ERROR(read_mqar(d["mqar"], "data.mqar", c.mqar));
    c.mqar.seq_len = c.seq_len;
    LOOM_RETURN_IF_ERROR(c.mqar.validate());
  }
  if (run_uses_task(c, "tool_dialogue") && d.contains("tool_dialogue"))
    LOOM_RETURN_IF_ERROR(
        read_tool_dialogue(d["tool_dialogue"], "data.tool_dialogue", c.tool_dialogue));
  if (run_uses_task(c, "passkey")) {
    if (d.contains("passkey")) {
      LOOM_RETURN_IF_ERROR(read_passkey(d["passkey"], "data.passkey", c.seq_len, c.passkey));
    } else {
      const absl::Status ok = c.passkey.validate(c.seq_len);
      if (!ok.ok()) return bad("data.passkey", std::string(ok.message()));
    }
  }
  if (tokenized) {
    LOOM_RETURN_IF_ERROR(read(d, "tokenizer", "data", c.tokenizer));
    if (d.contains("tokenizer") && c.tokenizer.empty())
      return bad("data.tokenizer", "'byte', a tokenizer folder or a tokenizer.json");
  }
  if (c.task == "shards") {
    if (!d.contains("shards") || !d["shards"].is_array() || d["shards"].empty())
      return bad("data.shards", "a non-empty list of shard files is required");
    for (const json& s : d["shards"]) {
      if (!s.is_string()) return bad("data.shards", "entries must be strings");
      c.shards.push_back(s.get<std::string>());
    }
  }

  LOOM_RETURN_IF_ERROR(read_stages(j, c));
  LOOM_RETURN_IF_ERROR(read(j, "loss_bucket", "run", c.loss_bucket));
  if (c.loss_bucket < 1 || c.loss_bucket > (1 << 20))
    return bad("run.loss_bucket", "must be in [1, 2^20]");
  if (!c.stages.empty()) {
    c.steps = 0;
    for (const StageConfig& s : c.stages) c.steps += s.max_steps;
  }

  LOOM_RETURN_IF_ERROR(read(j, "batch_size", "run", c.batch_size));
  if (c.batch_size < 1 || c.batch_size > 4096) return bad("run.batch_size", "must be in [1, 4096]");
  LOOM_RETURN_IF_ERROR(read(j, "data_parallel", "run", c.data_parallel));
  if (c.data_parallel < 1 || c.data_parallel > 64)
    return bad("run.data_parallel", "must be in [1, 64]");
  if (c.batch_size % c.data_parallel != 0)
    return bad("run.data_parallel",
               absl::StrCat("batch_size ", c.batch_size, " is not a multiple of ", c.data_parallel,
                            " ranks (each rank takes an equal share of every batch)"));
  if (c.data_parallel > 1 && c.device.is_cuda() && c.device.index != 0)
    return bad("run.data_parallel", "ranks run on devices 0..N-1: use run.device \"cuda\"");
  LOOM_RETURN_IF_ERROR(read(j, "steps", "run", c.steps));
  if (c.steps < 1) return bad("run.steps", "must be >= 1");
  LOOM_RETURN_IF_ERROR(read(j, "out", "run", c.out));
  if (c.out.empty()) return bad("run.out", "required (the run folder)");
  LOOM_RETURN_IF_ERROR(read(j, "checkpoint_every", "run", c.checkpoint_every));
  if (c.checkpoint_every < 0) return bad("run.checkpoint_every", "must be >= 0");
  LOOM_RETURN_IF_ERROR(read(j, "seed", "run", c.seed));

  LOOM_RETURN_IF_ERROR(read_optimizer(j, c.steps, c.optimizer));
  LOOM_RETURN_IF_ERROR(read_balance(j, c.optimizer));
  LOOM_RETURN_IF_ERROR(read(j, "max_tokens_per_pass", "run", c.optimizer.max_tokens_per_pass));
  if (c.optimizer.max_tokens_per_pass < 0)
    return bad("run.max_tokens_per_pass", "must be >= 0 (0: one example per pass)");
  LOOM_RETURN_IF_ERROR(c.optimizer.validate());
  return c;
}

bool run_uses_task(const RunConfig& c, std::string_view name) {
  if (c.task == name) return true;
  if (c.task != "mix") return false;
  return std::any_of(c.mix.begin(), c.mix.end(),
                     [&](const TaskWeight& t) { return t.task == name; });
}

absl::StatusOr<RunConfig> load_run_config(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(const std::string text, read_config_file(path));
  return parse_run_config(text);
}

namespace {

absl::Status read_flag(const json& obj, const char* key, std::string_view where, bool& out) {
  if (!obj.contains(key)) return absl::OkStatus();
  if (!obj[key].is_boolean())
    return bad(absl::StrCat(absl_sv(where), ".", key), "must be true or false");
  out = obj[key].get<bool>();
  return absl::OkStatus();
}

// A validate() failure of an options struct, with the config's prefix and the section named.
absl::Status section(std::string_view where, const absl::Status& st) {
  if (st.ok()) return st;
  return bad(where, std::string(st.message()));
}

absl::Status read_env(const json& e, EnvironmentConfig& env) {
  LOOM_RETURN_IF_ERROR(only_keys(e, "env", {"name", "arithmetic", "retrieval"}));
  LOOM_RETURN_IF_ERROR(read(e, "name", "env", env.name));
  if (e.contains("arithmetic")) {
    if (env.name != "arithmetic") return bad("env.arithmetic", "only for env.name arithmetic");
    const json& a = e["arithmetic"];
    LOOM_RETURN_IF_ERROR(only_keys(a, "env.arithmetic", {"operands", "max_operand", "ops"}));
    LOOM_RETURN_IF_ERROR(read(a, "operands", "env.arithmetic", env.arithmetic.operands));
    LOOM_RETURN_IF_ERROR(read(a, "max_operand", "env.arithmetic", env.arithmetic.max_operand));
    LOOM_RETURN_IF_ERROR(read(a, "ops", "env.arithmetic", env.arithmetic.ops));
  }
  if (e.contains("retrieval")) {
    if (env.name != "retrieval") return bad("env.retrieval", "only for env.name retrieval");
    const json& r = e["retrieval"];
    LOOM_RETURN_IF_ERROR(only_keys(r, "env.retrieval", {"records", "filler", "max_results"}));
    LOOM_RETURN_IF_ERROR(read(r, "records", "env.retrieval", env.retrieval.records));
    LOOM_RETURN_IF_ERROR(read(r, "filler", "env.retrieval", env.retrieval.filler));
    LOOM_RETURN_IF_ERROR(read(r, "max_results", "env.retrieval", env.retrieval.max_results));
  }
  return section("env", env.validate());
}

absl::Status read_grpo(const json& g, GrpoOptions& o) {
  LOOM_RETURN_IF_ERROR(only_keys(
      g, "grpo",
      {"scale_by_std", "clip_low", "clip_high", "kl_coef", "tis_cap", "drop_equal_reward_groups",
       "overlong_max_len", "overlong_buffer", "overlong_penalty"}));
  LOOM_RETURN_IF_ERROR(read_flag(g, "scale_by_std", "grpo", o.scale_by_std));
  LOOM_RETURN_IF_ERROR(read(g, "clip_low", "grpo", o.clip_low));
  LOOM_RETURN_IF_ERROR(read(g, "clip_high", "grpo", o.clip_high));
  LOOM_RETURN_IF_ERROR(read(g, "kl_coef", "grpo", o.kl_coef));
  LOOM_RETURN_IF_ERROR(read(g, "tis_cap", "grpo", o.tis_cap));
  LOOM_RETURN_IF_ERROR(
      read_flag(g, "drop_equal_reward_groups", "grpo", o.drop_equal_reward_groups));
  LOOM_RETURN_IF_ERROR(read(g, "overlong_max_len", "grpo", o.overlong_max_len));
  LOOM_RETURN_IF_ERROR(read(g, "overlong_buffer", "grpo", o.overlong_buffer));
  LOOM_RETURN_IF_ERROR(read(g, "overlong_penalty", "grpo", o.overlong_penalty));
  return section("grpo", o.validate());
}

}  // namespace

absl::StatusOr<RlConfig> parse_rl_config(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("run config: not valid JSON");
  // clang-format off
  static constexpr const char* kRlKeys[] = {
      "model", "env", "rollout", "grpo", "groups_per_step", "group_size", "steps", "optimizer",
      "balance", "routing_warnings", "warm_start", "replay", "engine", "routing_replay", "out",
      "checkpoint_every", "seed", "device", "time_limit_s", "log_samples"};
  // clang-format on
  LOOM_RETURN_IF_ERROR(only_keys(j, "rl", {std::begin(kRlKeys), std::end(kRlKeys)}));
  RlConfig c;
  LOOM_RETURN_IF_ERROR(read_model(j, "rl", c.model_config, c.model_seed, c.model_checkpoint));
  if (j.contains("env")) LOOM_RETURN_IF_ERROR(read_env(j["env"], c.env));
  if (j.contains("rollout")) {
    const json& r = j["rollout"];
    LOOM_RETURN_IF_ERROR(
        only_keys(r, "rollout", {"max_turns", "max_turn_tokens", "max_trajectory_tokens"}));
    LOOM_RETURN_IF_ERROR(read(r, "max_turns", "rollout", c.rollout.max_turns));
    LOOM_RETURN_IF_ERROR(read(r, "max_turn_tokens", "rollout", c.rollout.max_turn_tokens));
    LOOM_RETURN_IF_ERROR(
        read(r, "max_trajectory_tokens", "rollout", c.rollout.max_trajectory_tokens));
  }
  LOOM_RETURN_IF_ERROR(section("rollout", c.rollout.validate()));
  if (j.contains("grpo")) LOOM_RETURN_IF_ERROR(read_grpo(j["grpo"], c.grpo));
  LOOM_RETURN_IF_ERROR(read(j, "groups_per_step", "rl", c.groups_per_step));
  LOOM_RETURN_IF_ERROR(read(j, "group_size", "rl", c.group_size));
  if (c.groups_per_step < 1 || c.groups_per_step > 4096)
    return bad("rl.groups_per_step", "must be in [1, 4096]");
  if (c.group_size < 2 || c.group_size > 1024)
    return bad("rl.group_size", "must be in [2, 1024] (a group compares its members)");
  LOOM_RETURN_IF_ERROR(read(j, "steps", "rl", c.steps));
  if (c.steps < 1) return bad("rl.steps", "must be >= 1");
  LOOM_RETURN_IF_ERROR(read(j, "time_limit_s", "rl", c.time_limit_s));
  if (!(c.time_limit_s >= 0)) return bad("rl.time_limit_s", "must be >= 0 (0: no limit)");
  if (j.contains("warm_start")) {
    const json& w = j["warm_start"];
    LOOM_RETURN_IF_ERROR(only_keys(w, "warm_start", {"steps", "batch_size", "lr", "direct_share"}));
    LOOM_RETURN_IF_ERROR(read(w, "steps", "warm_start", c.warm_start_steps));
    LOOM_RETURN_IF_ERROR(read(w, "batch_size", "warm_start", c.warm_start_batch));
    LOOM_RETURN_IF_ERROR(read(w, "lr", "warm_start", c.warm_start_lr));
    if (c.warm_start_steps < 0 || c.warm_start_steps > (int64_t{1} << 40))
      return bad("warm_start.steps", "must be in [0, 2^40]");
    if (c.warm_start_batch < 1 || c.warm_start_batch > 4096)
      return bad("warm_start.batch_size", "must be in [1, 4096]");
    LOOM_RETURN_IF_ERROR(in_range("warm_start.lr", c.warm_start_lr, 1e-12, 1));
    LOOM_RETURN_IF_ERROR(read(w, "direct_share", "warm_start", c.warm_start_direct_share));
    LOOM_RETURN_IF_ERROR(in_range("warm_start.direct_share", c.warm_start_direct_share, 0, 1));
  }
  if (j.contains("replay")) {
    const json& r = j["replay"];
    LOOM_RETURN_IF_ERROR(only_keys(r, "replay", {"capacity", "max_age", "groups"}));
    LOOM_RETURN_IF_ERROR(read(r, "capacity", "replay", c.replay_capacity));
    LOOM_RETURN_IF_ERROR(read(r, "max_age", "replay", c.replay_max_age));
    LOOM_RETURN_IF_ERROR(read(r, "groups", "replay", c.replay_groups));
    if (c.replay_capacity < 0 || c.replay_capacity > 1 << 20)
      return bad("replay.capacity", "must be in [0, 2^20]");
    if (c.replay_max_age < 1) return bad("replay.max_age", "must be >= 1");
    if (c.replay_groups < 0 || c.replay_groups > c.replay_capacity)
      return bad("replay.groups", "must be in [0, replay.capacity]");
  }
  if (j.contains("engine")) {
    const json& e = j["engine"];
    LOOM_RETURN_IF_ERROR(
        only_keys(e, "engine", {"deterministic", "max_num_batched_tokens", "weight_dtype"}));
    LOOM_RETURN_IF_ERROR(read_flag(e, "deterministic", "engine", c.deterministic));
    LOOM_RETURN_IF_ERROR(read(e, "max_num_batched_tokens", "engine", c.max_num_batched_tokens));
    if (c.max_num_batched_tokens < 1) return bad("engine.max_num_batched_tokens", "must be >= 1");
    std::string dtype = "f32";
    LOOM_RETURN_IF_ERROR(read(e, "weight_dtype", "engine", dtype));
    if (dtype == "f32") {
      c.engine_weight_dtype = WeightDType::kF32;
    } else if (dtype == "bf16") {
      c.engine_weight_dtype = WeightDType::kBF16;
    } else {
      return bad("engine.weight_dtype",
                 "must be \"f32\" or \"bf16\" (the weight sync converts the trainer's f32 "
                 "values to those only; fp8 would need re-quantization on every sync)");
    }
  }
  std::string device = "cpu";
  LOOM_RETURN_IF_ERROR(read(j, "device", "rl", device));
  absl::StatusOr<Device> parsed_device = parse_device(device);
  if (!parsed_device.ok()) return bad("rl.device", std::string(parsed_device.status().message()));
  c.device = *parsed_device;
  std::string routing = "off";
  LOOM_RETURN_IF_ERROR(read(j, "routing_replay", "rl", routing));
  if (routing == "off") {
    c.routing_replay = RoutingReplayMode::kOff;
  } else if (routing == "measure") {
    c.routing_replay = RoutingReplayMode::kMeasure;
  } else if (routing == "on") {
    c.routing_replay = RoutingReplayMode::kOn;
  } else {
    return bad("rl.routing_replay", "must be \"off\", \"measure\" or \"on\"");
  }
  LOOM_RETURN_IF_ERROR(read(j, "out", "rl", c.out));
  if (c.out.empty()) return bad("rl.out", "required (the run folder)");
  LOOM_RETURN_IF_ERROR(read(j, "checkpoint_every", "rl", c.checkpoint_every));
  if (c.checkpoint_every < 0) return bad("rl.checkpoint_every", "must be >= 0");
  LOOM_RETURN_IF_ERROR(read(j, "log_samples", "rl", c.log_samples));
  if (c.log_samples < 0) return bad("rl.log_samples", "must be >= 0");
  LOOM_RETURN_IF_ERROR(read(j, "seed", "rl", c.seed));
  LOOM_RETURN_IF_ERROR(read_optimizer(j, c.steps, c.optimizer));
  LOOM_RETURN_IF_ERROR(read_balance(j, c.optimizer));
  LOOM_RETURN_IF_ERROR(c.optimizer.validate());
  return c;
}

absl::StatusOr<RlConfig> load_rl_config(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(const std::string text, read_config_file(path));
  return parse_rl_config(text);
}

}  // namespace loom
