// Evaluations of a trained model through the serving engine (issue 14), reported separately:
// needle-in-a-haystack exact recall on a grid of context length x needle depth (`passkey`), MQAR
// accuracy over queries (`mqar`), and multi-turn tool-task completion (`tool`). Prompts are built
// exactly as the training tasks lay them out (trainer/synthetic_tasks.h, tool_dialogues.h), the
// answers are greedy generations, and the scoring compares them with the task's own answer.
// `loom-trainer eval` runs these on a model folder; docs/trainer.md describes the output.
#pragma once

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "engine/chat/chat_template.h"
#include "engine/chat/tool_call_parser.h"
#include "engine/tokenizer/tokenizer.h"
#include "trainer/synthetic_tasks.h"
#include "trainer/tool_dialogues.h"

namespace loom {

// One greedy generation asked of the model.
struct GenerationRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 1;
};

// Runs greedy generations. The evaluation calls it with each batch of independent prompts and
// expects one token list per request, in order (the generated tokens, EOS included if sampled).
class Generator {
 public:
  virtual ~Generator() = default;
  virtual absl::StatusOr<std::vector<std::vector<int32_t>>> generate(
      const std::vector<GenerationRequest>& requests) = 0;
};

struct EvalOptions {
  std::string task;                                          // "passkey", "mqar" or "tool"
  std::vector<int64_t> lengths = {512, 1024, 2048};          // passkey: context tokens
  std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};  // passkey: needle depth
  int samples = 4;  // passkey: per cell; mqar: examples; tool: dialogues
  uint64_t seed = 1;
  int passkey_digits = 5;
  MqarOptions mqar;  // seq_len only matters with spread (the prompt ends at each query)
  ToolDialogueOptions tool;
  // The tool task's chat format and the syntax its replies are read in (a model folder's family:
  // chat_format_for_model_type, default_tool_call_syntax).
  ChatFormat format = ChatFormat::kNative;
  ToolCallSyntax syntax = ToolCallSyntax::kNative;

  // InvalidArgument naming the flag: unknown task, empty or non-positive grid, samples < 1.
  absl::Status validate() const;
};

struct EvalSummary {
  std::string task;
  double score = 0;   // passkey: exact recall over the grid; mqar: query accuracy; tool: share of
                      // dialogues with every call and answer right
  int64_t total = 0;  // passkey: samples; mqar: queries; tool: dialogues
  int64_t correct = 0;
};

// The random generator that builds a task's case `index` (passkey: {length index, depth index,
// sample}; mqar and tool: {sample}) from the seed: the cases are the training task's examples
// drawn from it (make_passkey, make_mqar, make_tool_dialogue), so a test can rebuild them.
std::mt19937_64 eval_case_rng(uint64_t seed, std::string_view task,
                              std::initializer_list<uint64_t> index);

// Runs the task, writing one JSON line per grid cell / example / dialogue and the summary line
// {"task", "score", "correct", "total"} to `out`; passkey also prints its grid as a table to
// `table` (when not null). `tokenizer` builds passkey and tool prompts (mqar uses ids only).
absl::StatusOr<EvalSummary> run_eval(const EvalOptions& options, const Tokenizer& tokenizer,
                                     Generator& generator, std::FILE* out, std::FILE* table);

// Loads `model_dir` on `device` (the folder's tokenizer, else the byte-level one; its family's
// chat format), builds an Engine on it and runs the task through it. `options.format` and
// `options.syntax` are overridden from the folder.
absl::StatusOr<EvalSummary> run_eval_on_model(const std::string& model_dir, Device device,
                                              EvalOptions options, std::FILE* out,
                                              std::FILE* table);

}  // namespace loom
