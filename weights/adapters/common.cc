#include "weights/adapters/common.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "weights/json_fields.h"

namespace loom::adapter {

bool split_layer(std::string_view canonical, int* layer, std::string_view* rest) {
  constexpr std::string_view kPrefix = "layers.";
  if (canonical.substr(0, kPrefix.size()) != kPrefix) return false;
  std::string_view tail = canonical.substr(kPrefix.size());
  const size_t dot = tail.find('.');
  if (dot == std::string_view::npos) return false;
  if (!absl::SimpleAtoi(absl_sv(tail.substr(0, dot)), layer) || *layer < 0) return false;
  *rest = tail.substr(dot + 1);
  return true;
}

TensorSource single(std::string name) {
  TensorSource s;
  s.names.push_back(std::move(name));
  return s;
}

TensorSource concat(std::vector<std::string> names) {
  TensorSource s;
  s.combine = TensorSource::Combine::kConcat;
  s.names = std::move(names);
  return s;
}

TensorSource stacked_experts(const std::string& prefix, int num_experts, std::string_view suffix) {
  TensorSource s;
  s.combine = TensorSource::Combine::kStack;
  for (int e = 0; e < num_experts; ++e) s.names.push_back(absl::StrCat(prefix, e, absl_sv(suffix)));
  return s;
}

bool lookup(std::string_view rest,
            const std::vector<std::pair<std::string_view, std::string_view>>& table,
            const std::string& checkpoint_prefix, TensorSource* out) {
  for (const auto& [canon, ckpt] : table) {
    if (rest == canon) {
      *out = single(absl::StrCat(checkpoint_prefix, absl_sv(ckpt)));
      return true;
    }
  }
  return false;
}

absl::Status not_found(std::string_view family, std::string_view canonical) {
  return absl::NotFoundError(
      absl::StrCat(absl_sv(family), " has no tensor for '", absl_sv(canonical), "'"));
}

std::function<absl::StatusOr<Tensor>(const Tensor&)> gather_rows_transform(RowRanges ranges) {
  return [ranges = std::move(ranges)](const Tensor& t) -> absl::StatusOr<Tensor> {
    if (t.ndim() < 1 || !t.is_contiguous())
      return absl::InvalidArgumentError("row regrouping needs a contiguous tensor");
    int64_t rows = 0;
    for (const auto& [b, e] : ranges) {
      if (b < 0 || e < b || e > t.dim(0))
        return absl::InvalidArgumentError(
            absl::StrCat("row range [", b, ", ", e, ") outside a tensor of ", t.dim(0), " rows"));
      rows += e - b;
    }
    Shape shape = t.shape();
    shape[0] = rows;
    Tensor out = Tensor::empty(shape, t.dtype());  // any dtype: rows are moved, not converted
    int64_t dst = 0;
    for (const auto& [b, e] : ranges) {
      out.slice(0, dst, dst + (e - b)).copy_from(t.slice(0, b, e));
      dst += e - b;
    }
    return out;
  };
}

absl::StatusOr<RopeConfig> parse_rope(const nlohmann::json& j, double default_theta,
                                      double default_partial) {
  using json_fields::get_bool_or;
  using json_fields::get_number_or;
  RopeConfig r;
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json* params = &empty;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object())
      return absl::InvalidArgumentError(absl::StrCat("field '", key, "' must be an object"));
    params = &*it;
    break;
  }
  LOOM_ASSIGN_OR_RETURN(double top_theta, get_number_or(j, "rope_theta", default_theta));
  LOOM_ASSIGN_OR_RETURN(r.theta, get_number_or(*params, "rope_theta", top_theta));
  LOOM_ASSIGN_OR_RETURN(double top_partial,
                        get_number_or(j, "partial_rotary_factor", default_partial));
  LOOM_ASSIGN_OR_RETURN(r.partial_rotary_factor,
                        get_number_or(*params, "partial_rotary_factor", top_partial));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    auto it = params->find(key);
    if (it != params->end() && it->is_string()) {
      type = it->get<std::string>();
      break;
    }
  }
  if (!(r.theta > 1.0))
    return absl::InvalidArgumentError(absl::StrCat("rope_theta must be > 1, got ", r.theta));
  if (!(r.partial_rotary_factor > 0.0 && r.partial_rotary_factor <= 1.0))
    return absl::InvalidArgumentError(
        absl::StrCat("partial_rotary_factor must be in (0, 1], got ", r.partial_rotary_factor));
  if (type == "default") {
    r.type = RopeConfig::Type::kDefault;
  } else if (type == "yarn") {
    r.type = RopeConfig::Type::kYarn;
    LOOM_ASSIGN_OR_RETURN(r.factor, json_fields::get_number(*params, "factor"));
    LOOM_ASSIGN_OR_RETURN(double max_pos, get_number_or(j, "max_position_embeddings", 0));
    LOOM_ASSIGN_OR_RETURN(r.original_max_position,
                          get_number_or(*params, "original_max_position_embeddings", max_pos));
    LOOM_ASSIGN_OR_RETURN(r.beta_fast, get_number_or(*params, "beta_fast", 32));
    LOOM_ASSIGN_OR_RETURN(r.beta_slow, get_number_or(*params, "beta_slow", 1));
    LOOM_ASSIGN_OR_RETURN(r.mscale, get_number_or(*params, "mscale", 0));
    LOOM_ASSIGN_OR_RETURN(r.mscale_all_dim, get_number_or(*params, "mscale_all_dim", 0));
    LOOM_ASSIGN_OR_RETURN(r.attention_factor, get_number_or(*params, "attention_factor", -1));
    LOOM_ASSIGN_OR_RETURN(r.truncate, get_bool_or(*params, "truncate", true));
    if (!(r.factor >= 1.0))
      return absl::InvalidArgumentError(absl::StrCat("rope factor must be >= 1, got ", r.factor));
    if (!(r.original_max_position > 0))
      return absl::InvalidArgumentError("yarn needs original_max_position_embeddings > 0");
    if (!(r.beta_fast > 0 && r.beta_slow > 0))
      return absl::InvalidArgumentError("yarn beta_fast and beta_slow must be > 0");
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("rope type '", type, "' is not supported (default, yarn)"));
  }
  return r;
}

absl::Status parse_common_fields(const nlohmann::json& j, const char* eps_key, double eps_default,
                                 const char* max_pos_key, int max_pos_default, ModelConfig* c) {
  using json_fields::get_bool_or;
  using json_fields::get_int;
  using json_fields::get_int_or;
  LOOM_ASSIGN_OR_RETURN(c->vocab_size, get_int(j, "vocab_size"));
  LOOM_ASSIGN_OR_RETURN(c->hidden_size, get_int(j, "hidden_size"));
  LOOM_ASSIGN_OR_RETURN(c->num_layers, get_int(j, "num_hidden_layers"));
  if (c->num_layers <= 0 || c->num_layers > 4096)
    return absl::InvalidArgumentError(
        absl::StrCat("field 'num_hidden_layers' must be in [1, 4096], got ", c->num_layers));
  LOOM_ASSIGN_OR_RETURN(double eps, json_fields::get_number_or(j, eps_key, eps_default));
  c->rms_norm_eps = static_cast<float>(eps);
  LOOM_ASSIGN_OR_RETURN(c->tie_word_embeddings, get_bool_or(j, "tie_word_embeddings", false));
  LOOM_ASSIGN_OR_RETURN(c->max_position_embeddings, get_int_or(j, max_pos_key, max_pos_default));
  LOOM_ASSIGN_OR_RETURN(c->bos_token_id, get_int_or(j, "bos_token_id", -1));
  LOOM_ASSIGN_OR_RETURN(c->eos_token_id, get_int_or(j, "eos_token_id", -1));
  return parse_quantization(j, c);
}

absl::Status parse_quantization(const nlohmann::json& j, ModelConfig* c) {
  auto it = j.find("quantization_config");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  const nlohmann::json& q = *it;
  auto bad = [](std::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantization_config: ", absl_sv(what),
                     " (supported: quant_method \"fp8\", fmt \"e4m3\", weight_block_size [rows, "
                     "cols], activation_scheme \"dynamic\")"));
  };
  if (!q.is_object()) return bad("not an object");
  auto str = [&](const char* key, std::string_view dflt) -> std::string {
    auto f = q.find(key);
    return f != q.end() && f->is_string() ? f->get<std::string>() : std::string(dflt);
  };
  if (str("quant_method", "") != "fp8")
    return bad(absl::StrCat("quant_method ", q.value("quant_method", nlohmann::json()).dump(),
                            " is not supported"));
  if (str("fmt", "e4m3") != "e4m3") return bad("fmt must be \"e4m3\"");
  // Activations: Loom dequantizes the weights at load and runs activations in its compute dtype,
  // which is what "dynamic" (per-token-group scales computed at run time) leaves open.
  if (str("activation_scheme", "dynamic") != "dynamic")
    return bad("activation_scheme must be \"dynamic\"");
  auto b = q.find("weight_block_size");
  if (b == q.end() || !b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() ||
      !(*b)[1].is_number_integer() || (*b)[0].get<int64_t>() <= 0 || (*b)[1].get<int64_t>() <= 0 ||
      (*b)[0].get<int64_t>() > 65536 || (*b)[1].get<int64_t>() > 65536)
    return bad("weight_block_size must be two positive integers");
  c->fp8_block_rows = (*b)[0].get<int>();
  c->fp8_block_cols = (*b)[1].get<int>();
  return absl::OkStatus();
}

absl::Status reject_true(const nlohmann::json& j, const char* key, std::string_view family) {
  auto it = j.find(key);
  if (it != j.end() && it->is_boolean() && it->get<bool>())
    return absl::InvalidArgumentError(
        absl::StrCat(key, " = true is not supported for ", absl_sv(family)));
  return absl::OkStatus();
}

absl::Status require_silu(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string() || (it->get<std::string>() != "silu" && it->get<std::string>() != "swish"))
    return absl::InvalidArgumentError(
        absl::StrCat("field '", key, "' = ", it->dump(), " is not supported (silu only)"));
  return absl::OkStatus();
}

}  // namespace loom::adapter
