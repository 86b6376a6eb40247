#include "clients/cpp/sse_reader.h"

#include "absl/strings/str_cat.h"

namespace loom::client {

absl::Status SseReader::feed(std::string_view bytes, const Callback& on_event) {
  if (!status_.ok()) return status_;
  if (at_start_ && !bytes.empty()) {
    // The BOM may itself be split across pieces; hold bytes until 3 arrived or one differs.
    constexpr std::string_view kBom = "\xEF\xBB\xBF";
    line_.append(bytes);
    if (line_.size() < kBom.size() && kBom.substr(0, line_.size()) == line_) return status_;
    at_start_ = false;
    std::string head = std::move(line_);
    line_.clear();
    if (std::string_view(head).substr(0, kBom.size()) == kBom) head.erase(0, kBom.size());
    return feed(head, on_event);
  }
  size_t start = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    char c = bytes[i];
    if (after_cr_) {
      after_cr_ = false;
      if (c == '\n') {  // the LF of a CRLF split across pieces
        start = i + 1;
        continue;
      }
    }
    if (c != '\n' && c != '\r') continue;
    std::string_view piece = bytes.substr(start, i - start);
    if (line_.empty()) {
      process_line(piece, on_event);
    } else {
      line_.append(piece);
      process_line(line_, on_event);
      line_.clear();
    }
    if (!status_.ok()) return status_;
    if (c == '\r') {
      if (i + 1 < bytes.size()) {
        if (bytes[i + 1] == '\n') ++i;
      } else {
        after_cr_ = true;
      }
    }
    start = i + 1;
  }
  line_.append(bytes.substr(start));
  if (line_.size() > max_line_bytes_) {
    status_ = absl::ResourceExhaustedError(
        absl::StrCat("server-sent events: a line exceeds ", max_line_bytes_, " bytes"));
    line_.clear();
  }
  return status_;
}

void SseReader::process_line(std::string_view line, const Callback& on_event) {
  if (line.empty()) {
    if (has_data_) {
      if (!pending_.data.empty() && pending_.data.back() == '\n') pending_.data.pop_back();
      on_event(pending_);
    }
    pending_.data.clear();
    pending_.event.clear();
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // comment (keep-alive)
  size_t colon = line.find(':');
  std::string_view field = line.substr(0, colon);
  std::string_view value;
  if (colon != std::string_view::npos) {
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (pending_.data.size() + value.size() > max_line_bytes_) {  // many lines, no blank line
      status_ = absl::ResourceExhaustedError(
          absl::StrCat("server-sent events: an event exceeds ", max_line_bytes_, " bytes"));
      return;
    }
    pending_.data.append(value);
    pending_.data.push_back('\n');
    has_data_ = true;
  } else if (field == "event") {
    pending_.event.assign(value);
  } else if (field == "id") {
    if (value.find('\0') == std::string_view::npos) pending_.id.assign(value);
  }
  // `retry` and unknown fields do not concern a client that never reconnects.
}

}  // namespace loom::client
