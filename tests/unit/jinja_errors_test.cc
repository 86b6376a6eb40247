// Loom's Jinja interpreter: every error names the problem and the template line; unsupported
// constructs are refused by name, never ignored.
#include <gtest/gtest.h>

#include "tests/unit/jinja_test_support.h"

namespace loom::jinja {
namespace {

TEST(JinjaErrors, RaiseExceptionCarriesMessageAndLine) {
  EXPECT_EQ(render("a\n{% if true %}\n{{ raise_exception('Conversation roles must alternate') }}\n"
                   "{% endif %}",
                   "{}"),
            "RENDER ERROR: chat template line 3: raise_exception: Conversation roles must "
            "alternate");
}

TEST(JinjaErrors, UndefinedAttributeOfUndefined) {
  EXPECT_EQ(render("\n{{ u.x }}", "{}"), "RENDER ERROR: chat template line 2: 'u' is undefined");
  EXPECT_EQ(render("{{ x.y.z }}", R"({"x": {}})"),
            "RENDER ERROR: chat template line 1: 'dict object' has no attribute 'y'");
}

TEST(JinjaErrors, UndefinedThroughNumberFilters) {
  EXPECT_EQ(render("{{ u | int }}", "{}"), "RENDER ERROR: chat template line 1: 'u' is undefined");
  EXPECT_EQ(render("{{ u | upper }}{{ u | list }}{{ u | length }}", "{}"), "[]0");
}

TEST(JinjaErrors, IntegerOverflowIsAnError) {
  for (const char* expr :
       {"9223372036854775807 + 1", "-9223372036854775807 - 2", "2 ** 63", "4294967296 * 4294967296",
        "(-9223372036854775807 - 1) // -1", "-(-9223372036854775807 - 1)"}) {
    EXPECT_EQ(render(std::string("{{ ") + expr + " }}", "{}"),
              "RENDER ERROR: chat template line 1: integer overflow (Loom's template integers are "
              "64-bit)")
        << expr;
  }
}

TEST(JinjaErrors, TypeErrors) {
  EXPECT_EQ(render("{{ 1 + 'a' }}", "{}"),
            "RENDER ERROR: chat template line 1: unsupported operand type(s) for +: 'int' and "
            "'str'");
  EXPECT_EQ(render("{{ 'a' + x }}", R"({"x": null})"),
            "RENDER ERROR: chat template line 1: unsupported operand type(s) for +: 'str' and "
            "'NoneType'");
  EXPECT_EQ(render("{{ 1 < 'a' }}", "{}"),
            "RENDER ERROR: chat template line 1: '<' not supported between instances of 'int' "
            "and 'str'");
  EXPECT_EQ(render("{% for x in none %}{% endfor %}", "{}"),
            "RENDER ERROR: chat template line 1: 'NoneType' object is not iterable");
  EXPECT_EQ(render("{{ 3 in x }}", R"({"x": null})"),
            "RENDER ERROR: chat template line 1: argument of type 'NoneType' is not iterable");
  EXPECT_EQ(render("{{ 7 % 0 }}", "{}"),
            "RENDER ERROR: chat template line 1: integer division or modulo by zero");
  EXPECT_EQ(render("{{ x | tojson }}", "{}"),
            "RENDER ERROR: chat template line 1: tojson: Object of type Undefined is not JSON "
            "serializable");
}

TEST(JinjaErrors, SyntaxErrorsNameTheLine) {
  EXPECT_EQ(render("line1\n{% if %}", "{}"),
            "PARSE ERROR: chat template line 2: expected an expression, got end of statement "
            "block '%}'");
  EXPECT_EQ(render("{% if x %}\nabc", "{}"),
            "PARSE ERROR: chat template line 2: unexpected end of template: expected 'elif' or "
            "'else' or 'endif'");
  EXPECT_EQ(render("{{ 'abc }}", "{}"),
            "PARSE ERROR: chat template line 1: unterminated string literal");
  EXPECT_EQ(render("a\n{{ x ", "{}"),
            "PARSE ERROR: chat template line 2: unclosed '{{' expression tag");
  EXPECT_EQ(render("{# never closed", "{}"),
            "PARSE ERROR: chat template line 1: missing end of comment tag '#}'");
  EXPECT_EQ(render("{% break %}", "{}"),
            "PARSE ERROR: chat template line 1: 'break' outside of a for loop");
}

TEST(JinjaErrors, UnsupportedConstructsAreNamed) {
  EXPECT_EQ(render("\n\n{% include 'x' %}", "{}"),
            "PARSE ERROR: chat template line 3: unsupported Jinja construct: {% include %}");
  EXPECT_EQ(render("{% raw %}x{% endraw %}", "{}"),
            "PARSE ERROR: chat template line 1: unsupported Jinja construct: {% raw %}");
  EXPECT_EQ(render("{% for x in y recursive %}{% endfor %}", "{}"),
            "PARSE ERROR: chat template line 1: unsupported Jinja construct: recursive for loop");
  EXPECT_EQ(render("{{ f(*args) }}", "{}"),
            "PARSE ERROR: chat template line 1: unsupported Jinja construct: *args / **kwargs in "
            "a call");
  EXPECT_EQ(render("{{ x | nosuchfilter }}", R"({"x": 1})"),
            "RENDER ERROR: chat template line 1: unknown Jinja filter 'nosuchfilter'");
  EXPECT_EQ(render("{{ x is nosuchtest }}", R"({"x": 1})"),
            "RENDER ERROR: chat template line 1: unknown Jinja test 'nosuchtest'");
  EXPECT_EQ(render("{{ '%s' % 1 }}", "{}"),
            "RENDER ERROR: chat template line 1: unsupported Jinja construct: printf-style "
            "string formatting ('%')");
}

TEST(JinjaErrors, SandboxRefusesMutation) {
  EXPECT_EQ(render("{% set l = [1] %}{{ l.append(2) }}", "{}"),
            "RENDER ERROR: chat template line 1: access to attribute 'append' of 'list' object "
            "is unsafe (immutable sandbox)");
  EXPECT_EQ(render("{{ x.update({}) }}", R"({"x": {}})"),
            "RENDER ERROR: chat template line 1: access to attribute 'update' of 'dict' object "
            "is unsafe (immutable sandbox)");
}

TEST(JinjaErrors, MacroArguments) {
  EXPECT_EQ(render("{% macro m(a) %}{{ a }}{% endmacro %}\n{{ m(1, 2) }}", "{}"),
            "RENDER ERROR: chat template line 2: macro 'm' takes no more than 1 argument(s)");
  EXPECT_EQ(render("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=1) }}", "{}"),
            "RENDER ERROR: chat template line 1: macro 'm' takes no keyword argument 'b'");
}

TEST(JinjaErrors, RunawayRecursionIsAnError) {
  EXPECT_EQ(render("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}", "{}"),
            "RENDER ERROR: chat template line 1: macro calls nested too deeply");
}

TEST(JinjaErrors, RunawayTemplatesStop) {
  EXPECT_EQ(render("{% for a in range(2000) %}\n{% for b in range(1000) %}{% endfor %}{% endfor %}",
                   "{}"),
            "RENDER ERROR: chat template line 2: template exceeds 1048576 loop iterations and "
            "macro calls");
  EXPECT_EQ(render("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + "
                   "ns.s %}{% endfor %}",
                   "{}"),
            "RENDER ERROR: chat template line 1: string exceeds 64 MiB");
}

TEST(JinjaErrors, DeepNestingIsAnError) {
  const std::string deep = "{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}";
  EXPECT_EQ(render(deep, "{}"), "PARSE ERROR: chat template line 1: template nesting too deep");
  std::string nots = "{{ ";
  for (int k = 0; k < 800; ++k) nots += "not ";
  EXPECT_EQ(render(nots + "1 }}", "{}"),
            "PARSE ERROR: chat template line 1: template nesting too deep");
  EXPECT_EQ(render("{{ " + std::string(100, '(') + "1" + std::string(100, ')') + " }}", "{}"), "1");
}

}  // namespace
}  // namespace loom::jinja
