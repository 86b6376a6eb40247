// Loom's Jinja lexer: whitespace control (trim_blocks, lstrip_blocks, `-`/`+`), comments, CRLF
// sources, literals.
// Expected strings: jinja2 3.1.6 with Hugging Face's settings (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols, HF's tojson), rendered with the same variables.
#include <gtest/gtest.h>

#include "tests/unit/jinja_test_support.h"

namespace loom::jinja {
namespace {

TEST(JinjaLexer, TrimBlocksAndLstripBlocks) {
  EXPECT_EQ(render("a\n  {% if true %}\n  x\n  {% endif %}\n  b\n", "{}"), "a\n  x\n  b");
}

TEST(JinjaLexer, MinusStripsAllWhitespace) {
  EXPECT_EQ(render("a  {%- if true -%}  x  {%- endif -%}  b", "{}"), "axb");
}

TEST(JinjaLexer, PlusKeepsLeadingWhitespace) {
  EXPECT_EQ(render("a\n  {%+ if true %}x{% endif %}\n", "{}"), "a\n  x");
}

TEST(JinjaLexer, CommentsAndCrlf) {
  EXPECT_EQ(render("  {# c #}\nx {#- c -#} y\r\nz\r\n", "{}"), "xy\nz");
}

TEST(JinjaLexer, ExpressionTagsKeepNewline) {
  EXPECT_EQ(render("{{ 'a' }}\n{{ 'b' }}\n", "{}"), "a\nb");
}

TEST(JinjaLexer, MinusOnExpressionTags) {
  EXPECT_EQ(render("{%- for m in [1, 2] -%}\n  {{- m -}}\n{%- endfor %}\nend\n\n", "{}"),
            "12end\n");
}

TEST(JinjaLexer, LstripOnlyWhenLineIsBlank) {
  EXPECT_EQ(render("  {% if true %}x{% endif %}  \n   {% if true %}\ny{% endif %}", "{}"),
            "x  \ny");
}

TEST(JinjaLexer, InlineBlocksKeepSpaces) {
  EXPECT_EQ(render("a {% if true %} b {% endif %} c", "{}"), "a  b  c");
}

TEST(JinjaLexer, SetBetweenLines) {
  EXPECT_EQ(render("{{ x }}\n{% set y = 1 %}\n  {{ y }}\n", "{\"x\": \"1\"}"), "1\n  1");
}

TEST(JinjaLexer, CommentMinusLstrip) {
  EXPECT_EQ(render("x\n    {#- comment #}\n  y", "{}"), "x  y");
}

TEST(JinjaLexer, CommentPlus) { EXPECT_EQ(render("x\n  {#+ comment #}\n  y", "{}"), "x\n    y"); }

TEST(JinjaLexer, BlankLines) {
  EXPECT_EQ(render("\n\n{% if true %}\n\n{% endif %}\n\n", "{}"), "\n\n\n");
}

TEST(JinjaLexer, CrlfAroundBlocks) {
  EXPECT_EQ(render("{% if true %}\r\nA\r\n{% endif %}\r\n", "{}"), "A\n");
}

TEST(JinjaLexer, CrlfInStringLiterals) {
  EXPECT_EQ(render("{{ 'a\r\nb' }}|{{ 'a\rb' }}", "{}"), "a\nb|a\nb");
}

TEST(JinjaLexer, TabsStripped) { EXPECT_EQ(render("a\t\t{% if 1 %}b{% endif %}", "{}"), "a\t\tb"); }

TEST(JinjaLexer, MixedControl) {
  EXPECT_EQ(render("a\n\t {% if 1 %}b\n {%- endif %}\n  {{- 'c' }}", "{}"), "a\nbc");
}

TEST(JinjaLexer, StringEscapes) {
  EXPECT_EQ(render("{{ \"\\u00e9\\n\\t\\x41\" }}{{ 'a\\\\b' }}{{ '\\d' }}", "{}"), "é\n\tAa\\b\\d");
}

TEST(JinjaLexer, AdjacentStringsAndNumbers) {
  EXPECT_EQ(render("{{ 'a' 'b' }}{{ 1_000 }}{{ 1_0.5 }}", "{}"), "ab100010.5");
}

}  // namespace
}  // namespace loom::jinja
