// Parser of Loom's Jinja interpreter: tokens -> syntax tree, following jinja2's grammar and
// operator precedence (parser.py). Statements: if/elif/else, for (tuple targets, `if` filter,
// else), set (plain, `ns.attr`, tuples, block set), macro, break/continue, generation (HF's
// AssistantTracker tag), filter blocks. Anything else (include, import, extends, block, call,
// raw, with, do, recursive loops) is an error naming the construct and the line.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/jinja_value.h"

namespace loom::jinja {

struct Expr {
  enum class Kind {
    kConst,    // value
    kName,     // name
    kList,     // kids
    kTuple,    // kids
    kDict,     // kids: key, value, key, value, ...
    kAttr,     // kids[0] . name
    kItem,     // kids[0] [ kids[1] ]
    kSlice,    // kids[0] [ kids[1] : kids[2] : kids[3] ] (null kids when absent)
    kCall,     // kids[0] ( kids[1..] ), arg_names[k] for kids[k+1] ("" positional)
    kFilter,   // kids[0] | name ( kids[1..] ), arg_names as kCall
    kTest,     // kids[0] is [not] name ( kids[1..] ), negated
    kNeg,      // - kids[0]
    kPos,      // + kids[0]
    kNot,      // not kids[0]
    kBinary,   // kids[0] op kids[1]: + - * / // % ** ~
    kAnd,      // kids[0] and kids[1]
    kOr,       // kids[0] or kids[1]
    kCompare,  // kids[0] ops[0] kids[1] ops[1] kids[2] ... (== != < <= > >= in notin)
    kCond,     // kids[0] if kids[1] else kids[2] (kids[2] null: no else)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;
  std::vector<std::string> ops;
  std::vector<std::string> arg_names;
  std::vector<std::unique_ptr<Expr>> kids;
  bool negated = false;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // conds[k] -> bodies[k]; bodies.size() == conds.size() + 1 when else
    kFor,       // targets in expr [if cond] body [else else_body]
    kSet,       // targets (or ns attr: target_obj.attr) = expr
    kBlockSet,  // targets[0] = rendered body, through filters (exprs: the filter chain)
    kMacro,     // name(params = defaults) body
    kBreak,
    kContinue,
    kGeneration,   // HF's {% generation %}: renders its body
    kFilterBlock,  // {% filter f %} body: expr is the filter chain applied to a placeholder
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;                // output value, for iterable, set value, filter chain
  ExprPtr cond;                // for ... if cond
  std::vector<ExprPtr> conds;  // if/elif conditions
  std::vector<Body> bodies;    // if/elif/else bodies
  Body body;                   // for, block set, macro, generation, filter block
  Body else_body;              // for ... else
  std::vector<std::string> targets;
  std::string attr;  // set ns.attr: targets[0] is the namespace name
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // parallel to params (null: no default)
};

struct ParsedTemplate {
  Body body;
};

// Throws jinja::Error with the line on a syntax error or an unsupported construct.
ParsedTemplate parse(std::string_view source);

}  // namespace loom::jinja
