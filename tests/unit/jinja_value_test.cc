// Python printing of values (str/repr, float repr) and HF's tojson (indent, separators,
// sort_keys, ensure_ascii).
// Expected strings: jinja2 3.1.6 with Hugging Face's settings (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols, HF's tojson), rendered with the same variables.
#include <gtest/gtest.h>

#include "tests/unit/jinja_test_support.h"

namespace loom::jinja {
namespace {

TEST(JinjaValue, PythonPrinting) {
  EXPECT_EQ(render("{{ none }} {{ true }} {{ [none, true, 'a\\'b', \"x\\\"y\"] }} {{ {'a': (1,), "
                   "'b': (1, 2)} }} {{ () }}{{ True }}{{ False }}{{ None }}",
                   "{}"),
            "None True [None, True, \"a'b\", 'x\"y'] {'a': (1,), 'b': (1, 2)} ()TrueFalseNone");
}

TEST(JinjaValue, ReprOfStrings) {
  EXPECT_EQ(
      render("{{ x }}", "{\"x\": [1, {\"a\": \"b'c\"}, \"d\\\"e\", \"f'g\\\"h\", \"\\né\"]}"),
      "[1, {'a': \"b'c\"}, 'd\"e', 'f\\'g\"h', '\\né\\x85']");
}

TEST(JinjaValue, FloatRepr) {
  EXPECT_EQ(
      render("{{ 1.0 }} {{ 1e16 }} {{ 1.5e-05 }} {{ 10000000000000000.0 }} {{ 123456789.123 }} {{ "
             "1e-4 }} {{ 0.00001 }} {{ -0.0 }} {{ 2.5e20 }} {{ 100.0 }} {{ 1e300 * 1e300 }}",
             "{}"),
      "1.0 1e+16 1.5e-05 1e+16 123456789.123 0.0001 1e-05 -0.0 2.5e+20 100.0 inf");
}

TEST(JinjaValue, ToJsonForms) {
  EXPECT_EQ(render("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(separators=(',', "
                   "':')) }}|{{ d | tojson(sort_keys=true) }}|{{ [] | tojson(indent=2) }}|{{ d | "
                   "tojson(indent='\\t') }}",
                   "{\"d\": {\"z\": [1, 2.0, {}, []], \"a\": \"é\\n\\\"<>&\", \"m\": null, \"f\": "
                   "1e-07, \"t\": true}}"),
            "{\"z\": [1, 2.0, {}, []], \"a\": \"é\\n\\\"<>&\", \"m\": null, \"f\": 1e-07, \"t\": "
            "true}|{\n  \"z\": [\n    1,\n    2.0,\n    {},\n    []\n  ],\n  \"a\": "
            "\"é\\n\\\"<>&\",\n  \"m\": null,\n  \"f\": 1e-07,\n  \"t\": "
            "true\n}|{\"z\":[1,2.0,{},[]],\"a\":\"é\\n\\\"<>&\",\"m\":null,\"f\":1e-07,\"t\":true}|"
            "{\"a\": \"é\\n\\\"<>&\", \"f\": 1e-07, \"m\": null, \"t\": true, \"z\": [1, 2.0, {}, "
            "[]]}|[]|{\n\t\"z\": [\n\t\t1,\n\t\t2.0,\n\t\t{},\n\t\t[]\n\t],\n\t\"a\": "
            "\"é\\n\\\"<>&\",\n\t\"m\": null,\n\t\"f\": 1e-07,\n\t\"t\": true\n}");
}

TEST(JinjaValue, ToJsonNumbers) {
  EXPECT_EQ(render("{{ x | tojson }}", "{\"x\": [1.0, 1e+16, 1.5e-05, -0.0, 12345]}"),
            "[1.0, 1e+16, 1.5e-05, -0.0, 12345]");
}

TEST(JinjaValue, ToJsonScalarsAndEmpty) {
  EXPECT_EQ(render("{{ 'x' | tojson }}{{ none | tojson }}{{ 1 | tojson(indent=4) }}|{{ {} | tojson "
                   "}}|{{ d | tojson(indent=1) }}",
                   "{\"d\": {\"a\": {}, \"b\": []}}"),
            "\"x\"null1|{}|{\n \"a\": {},\n \"b\": []\n}");
}

TEST(JinjaValue, ToJsonEnsureAscii) {
  EXPECT_EQ(render("{{ x | tojson(ensure_ascii=true) }}", "{\"x\": \"é😀\"}"),
            "\"\\u00e9\\ud83d\\ude00\"");
}

TEST(JinjaValue, NamespacePrints) {
  EXPECT_EQ(render("{{ namespace(a=1) }}", "{}"), "<Namespace {'a': 1}>");
}

}  // namespace
}  // namespace loom::jinja
