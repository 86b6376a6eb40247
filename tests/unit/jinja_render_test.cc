// Loom's Jinja interpreter: loops and loop.*, break/continue, scoping of set, namespace, macros,
// slicing, tests, operators, str/dict methods, filters.
// Expected strings: jinja2 3.1.6 with Hugging Face's settings (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols, HF's tojson), rendered with the same variables.
#include <gtest/gtest.h>

#include "tests/unit/jinja_test_support.h"

namespace loom::jinja {
namespace {

TEST(JinjaRender, LoopVariables) {
  EXPECT_EQ(render("{% for x in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ "
                   "loop.last }}{{ loop.length }}{{ loop.revindex }}|{% endfor %}",
                   "{}"),
            "10TrueFalse33|21FalseFalse32|32FalseTrue31|");
}

TEST(JinjaRender, LoopPrevNext) {
  EXPECT_EQ(
      render("{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", "{}"),
      "-2;1-3;2-;");
}

TEST(JinjaRender, ForElse) {
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}", "{}"), "empty");
}

TEST(JinjaRender, BreakContinue) {
  EXPECT_EQ(render("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 "
                   "%}{% break %}{% endif %}{{ x }}{% endfor %}",
                   "{}"),
            "0134");
}

TEST(JinjaRender, LoopFilter) {
  EXPECT_EQ(
      render("{% for x in range(6) if x is even %}{{ x }}{{ loop.length }}{% endfor %}", "{}"),
      "032343");
}

TEST(JinjaRender, DictItemsKeepOrder) {
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}",
                   "{\"d\": {\"b\": 1, \"a\": [1, 2.5, null, true, \"s\"]}}"),
            "b=1,a=[1, 2.5, None, True, 's'],");
}

TEST(JinjaRender, IterateDictKeys) {
  EXPECT_EQ(render("{% for k in d %}{{ k }}{% endfor %}", "{\"d\": {\"b\": 1, \"a\": 2}}"), "ba");
}

TEST(JinjaRender, NestedLoops) {
  EXPECT_EQ(render("{% for a in [1,2] %}{% for b in [3,4] %}{{ loop.index }}{{ a }}{{ b }} {% "
                   "endfor %}{{ loop.index }}|{% endfor %}",
                   "{}"),
            "113 214 1|123 224 2|");
}

TEST(JinjaRender, LoopCycle) {
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{% endfor %}", "{}"), "aba");
}

TEST(JinjaRender, UnpackPairs) {
  EXPECT_EQ(render("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", "{}"), "37");
}

TEST(JinjaRender, StringIteratesCodePoints) {
  EXPECT_EQ(render("{% for c in 'hé' %}[{{ c }}]{% endfor %}", "{}"), "[h][é]");
}

TEST(JinjaRender, UndefinedIteratesEmpty) {
  EXPECT_EQ(render("{% for x in undefined_thing %}a{% else %}b{% endfor %}", "{}"), "b");
}

TEST(JinjaRender, NamespaceAcrossLoop) {
  EXPECT_EQ(render("{% set ns = namespace(a=1, b='x') %}{% for i in range(3) %}{% set ns.a = ns.a "
                   "+ i %}{% endfor %}{{ ns.a }}{{ ns.b }}",
                   "{}"),
            "4x");
}

TEST(JinjaRender, NamespaceFromMacro) {
  EXPECT_EQ(render("{% macro f() %}{% set ns.v = 5 %}{% endmacro %}{% set ns = namespace(v=1) %}{{ "
                   "f() }}{{ ns.v }}",
                   "{}"),
            "5");
}

TEST(JinjaRender, SetInLoopDoesNotLeak) {
  EXPECT_EQ(
      render("{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{% endfor %}{{ x }}",
             "{}"),
      "0000");
}

TEST(JinjaRender, SetInIfLeaks) {
  EXPECT_EQ(render("{% set x = 5 %}{% if true %}{% set x = 6 %}{% endif %}{{ x }}", "{}"), "6");
}

TEST(JinjaRender, SetTupleAndBlockSet) {
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, %}{{ t }}{% set x %}in {{ 1 + "
                   "1 }}{% endset %}{{ x }}|{{ x | length }}",
                   "{}"),
            "12(1,)in 2|4");
}

TEST(JinjaRender, MacroDefaultsAndKeywords) {
  EXPECT_EQ(render("{% macro m(a, b=2, c='z') %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ m(1) }}{{ "
                   "m(1, 3) }}{{ m(1, c='q') }}",
                   "{}"),
            "[12z][13z][12q]");
}

TEST(JinjaRender, MacroScope) {
  EXPECT_EQ(render("{% set x = 1 %}{% macro f() %}{{ x }}{% set x = 2 %}{{ x }}{% endmacro %}{{ "
                   "f() }}{{ x }}",
                   "{}"),
            "121");
}

TEST(JinjaRender, MacroRecursion) {
  EXPECT_EQ(
      render(
          "{% macro r(n) %}{% if n > 0 %}{{ n }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(3) }}",
          "{}"),
      "321");
}

TEST(JinjaRender, Slicing) {
  EXPECT_EQ(
      render("{{ [1,2,3,4,5][1:3] }}{{ [1,2,3,4,5][::-1] }}{{ 'héllo'[::-1] }}{{ 'hello'[1:] }}{{ "
             "[1,2,3][-1] }}{{ 'abc'[-2:] }}{{ [1,2,3,4,5][::2] }}{{ [1,2,3,4,5][4:1:-2] }}",
             "{}"),
      "[2, 3][5, 4, 3, 2, 1]olléhello3bc[1, 3, 5][5, 3]");
}

TEST(JinjaRender, SliceOfContent) {
  EXPECT_EQ(render("{{ m.content[:3] }}{{ (m.content | string)[3:] }}",
                   "{\"m\": {\"content\": \"hello\"}}"),
            "hello");
}

TEST(JinjaRender, Tests) {
  EXPECT_EQ(
      render(
          "{{ x is defined }}{{ y is defined }}{{ x is none }}{{ s is string }}{{ d is mapping "
          "}}{{ l is iterable }}{{ n is number }}{{ f is float }}{{ n is integer }}{{ b is boolean "
          "}}{{ b is true }}{{ b is false }}{{ n is not none }}",
          "{\"x\": null, \"s\": \"a\", \"d\": {}, \"l\": [], \"n\": 3, \"f\": 1.5, \"b\": false}"),
      "TrueFalseTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueTrue");
}

TEST(JinjaRender, MoreTests) {
  EXPECT_EQ(
      render("{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ 4 is even }}{{ x is divisibleby 3 }}{{ x "
             "is odd }}{% if f is sameas false %}F{% endif %}{% if y is sameas none %}N{% endif %}",
             "{\"x\": 3, \"f\": false, \"y\": null}"),
      "TrueTrueTrueTrueTrueFN");
}

TEST(JinjaRender, Arithmetic) {
  EXPECT_EQ(
      render("{{ 0.1 + 0.2 }} {{ 3 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ "
             "10 / 5 }} {{ [1, 2] + [3] }}{{ 'ab' * 3 }}{{ -x }}{{ +x }}{{ (1, 2)[0] }}",
             "{\"x\": 3}"),
      "0.30000000000000004 1.5 3 -4 2 1024 2.0 [1, 2, 3]ababab-331");
}

TEST(JinjaRender, LogicReturnsOperands) {
  EXPECT_EQ(render("{{ 'a' if x else 'b' }}{{ 'c' if not x }}{{ x or 'y' }}{{ x and 'y' }}{{ 1 < 2 "
                   "< 3 }}{{ 'a' in 'cat' }}{{ 3 not in [1,2] }}{{ 'k' in {'k': 1} }}{{ true and "
                   "not false or none }}{{ not 1 == 2 }}",
                   "{\"x\": 0}"),
            "bcy0TrueTrueTrueTrueTrueTrue");
}

TEST(JinjaRender, Comparisons) {
  EXPECT_EQ(render("{{ 'x' < 'y' }}{{ [1,2] < [1,3] }}{{ 1 < 2.5 }}{{ 'a' == 'a' }}{{ 1 == 1.0 "
                   "}}{{ true == 1 }}{{ none == none }}{{ [1] == [1] }}{{ x == y }}",
                   "{}"),
            "TrueTrueTrueTrueTrueTrueTrueTrueTrue");
}

TEST(JinjaRender, ElifElse) {
  EXPECT_EQ(
      render(
          "{% if x %}a{% elif y %}b{% else %}c{% endif %}{{ 1 if false else 2 if false else 3 }}",
          "{\"x\": false, \"y\": []}"),
      "c3");
}

TEST(JinjaRender, StringMethods) {
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a b c'.split(' ', 1) }}{{ "
                   "'xxhixx'.strip('x') }}{{ '  hi '.lstrip() }}|{{ '  hi '.rstrip() }}|{{ "
                   "'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'aaa'.replace('a', "
                   "'b', 2) }}{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}{{ 'hello world'.title() }}{{ "
                   "'abc'.find('c') }}{{ 'abcabc'.count('bc') }}{{ '-'.join(['a','b']) }}",
                   "{}"),
            "['a', 'b', '', 'c']['a', 'b']['a', 'b c']hihi |  hi|TrueTruebbaHIhiHello World22a-b");
}

TEST(JinjaRender, SplitVariants) {
  EXPECT_EQ(render("{{ '  a b  \\t'.split() }}{{ 'a  b c'.split(None, 1) }}{{ ' a b '.split(' ') "
                   "}}{{ x.split('</think>')[-1].lstrip('\\n') }}",
                   "{\"x\": \"<think>a</think>\\n\\nans\"}"),
            "['a', 'b']['a', 'b c']['', 'a', 'b', '']ans");
}

TEST(JinjaRender, DictMethodsAndAccess) {
  EXPECT_EQ(
      render(
          "{{ d.get('a') }}{{ d.get('zz') }}{{ d.get('zz', 5) }}{{ d.keys() | list }}{{ d.values() "
          "| list }}{{ d['a'] }}{{ d.a }}{{ d.zz }}|{{ d['zz'] is defined }}{{ d.items() | list }}",
          "{\"d\": {\"a\": 1}}"),
      "1None5['a'][1]11|False[('a', 1)]");
}

TEST(JinjaRender, GetKeepsNone) {
  EXPECT_EQ(
      render("{{ m.get('reasoning_content', '') }}", "{\"m\": {\"reasoning_content\": null}}"),
      "None");
}

TEST(JinjaRender, NestedAccess) {
  EXPECT_EQ(render("{% set d = {'a': 1, 'b': {'c': [1, 2]}} %}{{ d.b.c[1] }}{{ d['b']['c'][0] }}{{ "
                   "x.0 }}{{ x.1.a }}",
                   "{\"x\": [5, {\"a\": 6}]}"),
            "2156");
}

TEST(JinjaRender, MissingAttributeIsUndefined) {
  EXPECT_EQ(render("{{ x.missing | default('d') }}{{ x.missing is defined }}{{ 'a' ~ x.y }}{{ (u | "
                   "default({})).get('a', 2) }}",
                   "{\"x\": {\"a\": 1}}"),
            "dFalsea2");
}

TEST(JinjaRender, OutOfRangeIsUndefined) {
  EXPECT_EQ(render("{{ x[0] }}|{{ x[5] }}|{{ [] | first }}|", "{\"x\": \"ab\"}"), "a|||");
}

TEST(JinjaRender, Filters) {
  EXPECT_EQ(render("{{ x | default('dflt') }}{{ '' | default('e', true) }}{{ [3,1,2] | first }}{{ "
                   "[3,1,2] | last }}{{ [3,1,2] | join(',') }}{{ '  t  ' | trim }}{{ 5 | string "
                   "}}{{ 'ABC' | lower }}{{ [1,1,2] | unique | list }}{{ 'a' ~ 1 ~ none }}",
                   "{}"),
            "dflte323,1,2t5abc[1, 2]a1None");
}

TEST(JinjaRender, LengthFilter) {
  EXPECT_EQ(render("{{ 'abc' | length }}{{ 'héé' | length }}{{ {'a':1} | length }}{{ [1,[2]] | "
                   "length }}{{ x | string | length }}",
                   "{\"x\": [1, 2]}"),
            "33126");
}

TEST(JinjaRender, FilterPrecedence) {
  EXPECT_EQ(render("{%- set x = [1,2,3] -%}\n{{ x|length-1 }}{{ x[x|length-1] }}", "{}"), "23");
}

TEST(JinjaRender, SelectAndMap) {
  EXPECT_EQ(
      render("{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='content') | "
             "join('|') }}{{ msgs | rejectattr('role', 'eq', 'user') | list | length }}{{ [1,2,3] "
             "| select('odd') | list }}{{ [1,2,3] | reject('odd') | list }}{{ ['a','B'] | "
             "map('upper') | list }}",
             "{\"msgs\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
             "\"content\": \"b\"}, {\"role\": \"user\", \"content\": \"c\"}]}"),
      "a|c1[1, 3][2]['A', 'B']");
}

TEST(JinjaRender, NumberFilters) {
  EXPECT_EQ(render("{{ 5 | abs }}{{ -5.5 | abs }}{{ '3' | int + 1 }}{{ '2.5' | float }}{{ 'x' | "
                   "int }}{{ 3.9 | int }}{{ [1,2] | reverse | list }}{{ 'abc' | reverse }}",
                   "{}"),
            "55.542.503[2, 1]cba");
}

TEST(JinjaRender, TextFilters) {
  EXPECT_EQ(render("{{ 'hello world' | capitalize }}{{ 'x\\ny' | indent(2) }}|{{ 'x\\ny' | "
                   "indent(2, true) }}{% filter upper %}abc{% endfilter %}",
                   "{}"),
            "Hello worldx\n  y|  x\n  yABC");
}

TEST(JinjaRender, Range) {
  EXPECT_EQ(
      render("{{ range(3) | list }}{{ range(1, 7, 2) | list }}{{ range(3, 0, -1) | list }}", "{}"),
      "[0, 1, 2][1, 3, 5][3, 2, 1]");
}

TEST(JinjaRender, HfVariablesAlwaysDefined) {
  EXPECT_EQ(render("{{ tools is none }}{{ documents is none }}{{ messages | length }}{{ "
                   "add_generation_prompt }}",
                   "{}"),
            "TrueTrue0False");
}

TEST(JinjaRender, TrailingCommas) {
  EXPECT_EQ(render("{{ [1, 2,] }}{{ {'a': 1,} }}{{ (1, 2,) }}", "{}"), "[1, 2]{'a': 1}(1, 2)");
}

TEST(JinjaRender, DictsortAndSort) {
  EXPECT_EQ(
      render("{% for k, v in d|dictsort %}{{ k }}={{ v }};{% endfor %}|{% for k, v in "
             "d|dictsort(reverse=true) %}{{ k }}{% endfor %}|{{ d|dictsort(by='value') }}{{ ['b', "
             "'A', 'a']|sort }}{{ ['b', 'A', 'a']|sort(case_sensitive=true) }}{{ [3, 1, "
             "2]|sort(reverse=true) }}{{ m|sort(attribute='n')|map(attribute='n')|list }}",
             "{\"d\": {\"b\": 2, \"A\": 3, \"a\": 1, \"C\": 0}, \"m\": [{\"n\": 2}, {\"n\": 1}]}"),
      "A=3;a=1;b=2;C=0;|CbAa|[('C', 0), ('a', 1), ('b', 2), ('A', 3)]['A', 'a', 'b']['A', 'a', "
      "'b'][3, 2, 1][1, 2]");
}

TEST(JinjaRender, MultiLineCallsAndContinuation) {
  EXPECT_EQ(render("{% macro f(a,\n   b) %}{{ a }}{{ b }}{% endmacro %}{{- f(\n  'x',\n  'y'\n) "
                   "-}}{{ \"a\\\nb\" }}",
                   "{}"),
            "xyab");
}

TEST(JinjaRender, LoopFilterOnItemsAndDictEquality) {
  EXPECT_EQ(render("{% for key, val in d.items() if key != 'return' %}{{ key }}{% endfor %}{{ m == "
                   "l[-1] }}{{ m == l[0] }}{{ (m|tojson)[:-1] }}",
                   "{\"d\": {\"a\": 1, \"return\": 2, \"b\": 3}, \"m\": {\"a\": 1}, \"l\": "
                   "[{\"a\": 2}, {\"a\": 1}]}"),
            "abTrueFalse{\"a\": 1");
}

TEST(JinjaRender, ForElseAfterContinueOrFirstBreak) {
  EXPECT_EQ(render("{% for i in [1,2] %}{{i}}{% continue %}{% else %}E{% endfor %}|{% for i in "
                   "[1,2] %}{{i}}{% if i == 2 %}{% continue %}{% endif %}{% else %}E{% endfor "
                   "%}|{% for i in [1,2] %}{{i}}{% break %}{% else %}E{% endfor %}|{% for i in "
                   "[1,2] %}{% if i == 2 %}{% break %}{% endif %}{{i}}{% else %}E{% endfor %}",
                   "{}"),
            "12E|12|1E|1");
}

TEST(JinjaRender, EvenOddOnFloats) {
  EXPECT_EQ(render("{{ 2.5 is even }}{{ 4.0 is even }}{{ 3.0 is odd }}{{ -1.0 is odd }}", "{}"),
            "FalseTrueTrueTrue");
}

TEST(JinjaRender, IntegerArithmetic) {
  EXPECT_EQ(
      render("{{ 2 ** 10 }} {{ (-1) ** 5 }} {{ (-1) ** 6 }} {{ 0 ** 0 }} {{ 1 ** 100000 }} {{ 2 ** "
             "-1 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ -7 // 2 }} {{ 3 * -4 }} {{ -(5) }} {{ (-5)|abs }}",
             "{}"),
      "1024 -1 1 1 1 0.5 2 -2 -4 -12 -5 5");
}

TEST(JinjaRender, SplitOnce) {
  EXPECT_EQ(render("{% if '</think>' in x %}{{ x.split('</think>', 1)[1] }}{% endif %}",
                   "{\"x\": \"a</think>b</think>c\"}"),
            "b</think>c");
}

}  // namespace
}  // namespace loom::jinja
