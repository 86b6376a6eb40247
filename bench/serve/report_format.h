// Renders the level reports of a `loom-bench serve` run: a text table for stdout, a Markdown
// section for results files, and a JSON document with every number.
#pragma once

#include <string>
#include <vector>

#include "bench/serve/level_report.h"
#include "bench/serve/serve_options.h"
#include "nlohmann/json.hpp"

namespace loom::bench {

// The run as a whole: what was measured, against what, when.
struct RunInfo {
  ServeOptions options;
  std::string model;       // the id sent with the requests
  std::string started_at;  // UTC, RFC 3339
};

// Column-aligned table, one row per level; latencies in milliseconds, "-" where there is no
// sample.
std::string format_table(const std::vector<LevelReport>& levels);

// A `## ...` section: the settings as bullets, then the same table in Markdown.
std::string format_markdown(const RunInfo& info, const std::vector<LevelReport>& levels);

// Settings, model, the percentile definition and, per level, every summary plus each request's
// own numbers. Latencies in milliseconds (keys end in _ms); null where there is no sample.
nlohmann::json report_json(const RunInfo& info, const std::vector<LevelReport>& levels);

}  // namespace loom::bench
