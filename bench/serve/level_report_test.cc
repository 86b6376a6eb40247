// summarize_level and the renderings, on hand-made records whose numbers are easy to check.
#include "bench/serve/level_report.h"

#include "absl/strings/str_split.h"
#include "bench/serve/report_format.h"
#include "gtest/gtest.h"

namespace loom::bench {
namespace {

constexpr double kEps = 1e-9;

RequestRecord ok_record(double ttft_s, std::vector<double> itl_s, double e2e_s, int64_t tokens) {
  RequestRecord r;
  r.ok = true;
  r.has_text = true;
  r.ttft_s = ttft_s;
  r.itl_s = std::move(itl_s);
  r.e2e_s = e2e_s;
  r.output_tokens = tokens;
  return r;
}

RequestRecord failed_record(std::string why) {
  RequestRecord r;
  r.error = std::move(why);
  return r;
}

LevelRun sample_run() {
  LevelRun run;
  run.concurrency = 2;
  run.wall_s = 2.0;
  // TPOT: (0.5 - 0.1) / 4 = 0.1 s and (0.9 - 0.3) / 4 = 0.15 s.
  run.records.push_back(ok_record(0.1, {0.1, 0.1, 0.1, 0.1}, 0.5, 5));
  run.records.push_back(failed_record("HTTP 503: busy"));
  run.records.push_back(ok_record(0.3, {0.2, 0.2, 0.2}, 0.9, 5));
  run.records.push_back(failed_record("HTTP 503: busy"));
  run.records.push_back(failed_record("connect: refused"));
  return run;
}

TEST(LevelReport, CountsThroughputAndLatencies) {
  LevelReport r = summarize_level(sample_run());
  EXPECT_EQ(r.concurrency, 2);
  EXPECT_EQ(r.requests, 5);
  EXPECT_EQ(r.ok, 2);
  EXPECT_EQ(r.failed, 3);
  EXPECT_EQ(r.output_tokens, 10);
  EXPECT_NEAR(r.output_throughput, 5.0, kEps);   // 10 tokens / 2 s
  EXPECT_NEAR(r.request_throughput, 1.0, kEps);  // 2 ok / 2 s

  ASSERT_TRUE(r.ttft_ms && r.itl_ms && r.tpot_ms && r.e2e_ms);
  EXPECT_EQ(r.ttft_ms->count, 2);
  EXPECT_NEAR(r.ttft_ms->mean, 200.0, kEps);
  EXPECT_NEAR(r.ttft_ms->p50, 200.0, kEps);
  EXPECT_NEAR(r.ttft_ms->p99, 298.0, kEps);  // 100 + 0.99 * 200

  // Seven gaps pooled: four of 100 ms, three of 200 ms; the median (rank 3) is 100 ms.
  EXPECT_EQ(r.itl_ms->count, 7);
  EXPECT_NEAR(r.itl_ms->mean, 1000.0 / 7.0, kEps);
  EXPECT_NEAR(r.itl_ms->p50, 100.0, kEps);
  EXPECT_NEAR(r.itl_ms->p90, 200.0, kEps);

  EXPECT_EQ(r.tpot_ms->count, 2);
  EXPECT_NEAR(r.tpot_ms->mean, 125.0, kEps);
  EXPECT_NEAR(r.tpot_ms->min, 100.0, kEps);
  EXPECT_NEAR(r.tpot_ms->max, 150.0, kEps);
  EXPECT_NEAR(r.e2e_ms->p50, 700.0, kEps);

  ASSERT_EQ(r.errors.size(), 2u);
  EXPECT_EQ(r.errors[0].message, "HTTP 503: busy");
  EXPECT_EQ(r.errors[0].count, 2);
  EXPECT_EQ(r.errors[1].count, 1);
  EXPECT_EQ(r.records.size(), 5u);
}

TEST(LevelReport, OneTokenRequestsHaveNoTpotAndAllFailedHasNoLatencies) {
  LevelRun one;
  one.concurrency = 1;
  one.wall_s = 1.0;
  one.records.push_back(ok_record(0.05, {}, 0.05, 1));
  LevelReport r = summarize_level(one);
  EXPECT_TRUE(r.ttft_ms.has_value());
  EXPECT_FALSE(r.itl_ms.has_value());
  EXPECT_FALSE(r.tpot_ms.has_value());

  LevelRun bad;
  bad.concurrency = 1;
  bad.wall_s = 0.5;
  bad.records.push_back(failed_record("x"));
  LevelReport b = summarize_level(bad);
  EXPECT_EQ(b.ok, 0);
  EXPECT_EQ(b.output_throughput, 0);
  EXPECT_FALSE(b.ttft_ms.has_value());
  EXPECT_FALSE(b.e2e_ms.has_value());
  // Missing statistics print as "-" and serialize as null.
  EXPECT_NE(format_table({b}).find(" -"), std::string::npos);
  RunInfo info;
  info.options.concurrency = {1};
  EXPECT_TRUE(report_json(info, {b})["levels"][0]["ttft_ms"].is_null());
}

TEST(LevelReport, RequestsWithoutTextCountButHaveNoTokenTimings) {
  LevelRun run;
  run.concurrency = 1;
  run.wall_s = 1.0;
  run.records.push_back(ok_record(0.2, {0.1}, 0.4, 3));
  RequestRecord silent;  // finished with usage but streamed no text
  silent.ok = true;
  silent.e2e_s = 0.6;
  silent.output_tokens = 3;
  run.records.push_back(silent);
  LevelReport r = summarize_level(run);
  EXPECT_EQ(r.ok, 2);
  EXPECT_EQ(r.no_text, 1);
  EXPECT_EQ(r.output_tokens, 6);  // both requests' tokens count toward throughput
  ASSERT_TRUE(r.ttft_ms && r.e2e_ms && r.tpot_ms);
  EXPECT_EQ(r.ttft_ms->count, 1);
  EXPECT_EQ(r.tpot_ms->count, 1);
  EXPECT_NEAR(r.tpot_ms->mean, 100.0, kEps);  // (0.4 - 0.2) / 2
  EXPECT_EQ(r.e2e_ms->count, 2);
  EXPECT_NE(format_table({r}).find("1 of 2 ok requests streamed no text"), std::string::npos);
  RunInfo info;
  nlohmann::json j = report_json(info, {r});
  EXPECT_EQ(j["levels"][0]["no_text"], 1);
  EXPECT_TRUE(j["levels"][0]["per_request"][1]["ttft_ms"].is_null());
  EXPECT_EQ(j["levels"][0]["per_request"][1]["text_chunks"], 0);
}

TEST(ReportFormat, MarkdownHasARowPerLevelAndJsonEveryNumber) {
  RunInfo info;
  info.model = "m";
  info.options.url = "http://127.0.0.1:1";
  info.options.concurrency = {2, 4};
  std::vector<LevelReport> levels = {summarize_level(sample_run()), summarize_level(sample_run())};
  levels[1].concurrency = 4;

  std::string md = format_markdown(info, levels);
  int rows = 0;
  for (absl::string_view line : absl::StrSplit(md, '\n')) {
    if (line.substr(0, 4) == "| 2 " || line.substr(0, 4) == "| 4 ") ++rows;
  }
  EXPECT_EQ(rows, 2) << md;
  EXPECT_NE(md.find("| conc | ok | failed |"), std::string::npos) << md;

  nlohmann::json j = report_json(info, levels);
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["settings"]["concurrency"], nlohmann::json({2, 4}));
  ASSERT_EQ(j["levels"].size(), 2u);
  EXPECT_EQ(j["levels"][1]["concurrency"], 4);
  EXPECT_EQ(j["levels"][0]["failed"], 3);
  EXPECT_NEAR(j["levels"][0]["tpot_ms"]["mean"].get<double>(), 125.0, kEps);
  EXPECT_EQ(j["levels"][0]["per_request"].size(), 5u);
  EXPECT_EQ(j["levels"][0]["per_request"][1]["error"], "HTTP 503: busy");
  EXPECT_EQ(j["levels"][0]["per_request"][0]["text_chunks"], 5);
}

}  // namespace
}  // namespace loom::bench
