#include "engine/choice_text.h"

#include <utility>

namespace loom {

ChoiceText::ChoiceText(const Tokenizer* tokenizer, const std::vector<std::string>& stops) {
  if (tokenizer != nullptr) detok_ = std::make_unique<StreamingDetokenizer>(*tokenizer);
  if (!stops.empty()) stop_ = std::make_unique<StopChecker>(stops);
}

std::string ChoiceText::push(int32_t token, bool stop_strings_apply, bool* stopped) {
  *stopped = false;
  if (!detok_) return "";
  absl::StatusOr<std::string> piece = detok_->push(token);
  std::string text = piece.ok() ? *std::move(piece) : std::string();
  if (!stop_) return text;
  if (!stop_strings_apply) return stop_->flush() + text;
  std::string out = stop_->push(text, stopped);
  if (*stopped) ended_ = true;
  return out;
}

std::string ChoiceText::finish() {
  if (ended_ || !detok_) return "";
  std::string tail = detok_->finish();
  if (!stop_) return tail;
  bool stopped = false;
  std::string out = stop_->push(tail, &stopped);
  if (!stopped) out += stop_->flush();
  return out;
}

}  // namespace loom
