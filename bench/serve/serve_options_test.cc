#include "bench/serve/serve_options.h"

#include "gtest/gtest.h"

namespace loom::bench {
namespace {

TEST(ServeOptions, ConcurrencyListParses) {
  auto v = parse_concurrency_list("1,2, 4,32");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, (std::vector<int>{1, 2, 4, 32}));
}

TEST(ServeOptions, ConcurrencyListRejectsNonPositiveJunkAndRepeats) {
  for (const char* bad : {"0", "1,0", "-2", "", "1,,2", "a", "1.5", "5000", "2,2"}) {
    auto v = parse_concurrency_list(bad);
    EXPECT_FALSE(v.ok()) << bad;
    EXPECT_NE(v.status().message().find("--concurrency"), absl::string_view::npos) << bad;
  }
}

TEST(ServeOptions, DefaultRequestCountIsFourPerWorkerAtLeastSixteen) {
  ServeOptions o;
  EXPECT_EQ(requests_for_level(o, 1), 16);
  EXPECT_EQ(requests_for_level(o, 4), 16);
  EXPECT_EQ(requests_for_level(o, 32), 128);
  o.requests = 6;
  EXPECT_EQ(requests_for_level(o, 32), 6);
}

}  // namespace
}  // namespace loom::bench
