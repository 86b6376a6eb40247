#include "engine/chat/jinja_parser.h"

#include <cstdlib>
#include <utility>

#include "engine/chat/jinja_lexer.h"

namespace loom::jinja {
namespace {

using TK = Token::Kind;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  ParsedTemplate run() {
    ParsedTemplate t;
    t.body = parse_body({});
    if (cur().kind != TK::kEnd) {
      fail("unexpected '{% " + cur().value + " %}'", cur().line);
    }
    return t;
  }

 private:
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  void next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool is_op(std::string_view op) const { return cur().kind == TK::kOp && cur().value == op; }
  bool is_name(std::string_view n) const { return cur().kind == TK::kName && cur().value == n; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TK::kBlockEnd:
        return "end of statement block '%}'";
      case TK::kVarEnd:
        return "end of print statement '}}'";
      case TK::kEnd:
        return "end of template";
      case TK::kString:
        return "string literal";
      case TK::kData:
        return "template text";
      default:
        return "'" + t.value + "'";
    }
  }
  [[noreturn]] void unexpected(std::string_view expected) const {
    fail("expected " + std::string(expected) + ", got " + describe(cur()), cur().line);
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) unexpected("'" + std::string(op) + "'");
  }
  std::string expect_name() {
    if (cur().kind != TK::kName) unexpected("a name");
    std::string n = cur().value;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().kind != TK::kBlockEnd) unexpected("end of statement block '%}'");
    next();
  }

  // Parses statements until `{% <one of end_names>`; leaves the position at that name.
  Body parse_body(const std::vector<std::string_view>& end_names) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == TK::kEnd) {
        if (!end_names.empty()) {
          std::string names;
          for (auto n : end_names) names += (names.empty() ? "'" : " or '") + std::string(n) + "'";
          fail("unexpected end of template: expected " + names, t.line);
        }
        return body;
      }
      if (t.kind == TK::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = t.line;
        s->text = t.value;
        body.push_back(std::move(s));
        next();
      } else if (t.kind == TK::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = t.line;
        next();
        s->expr = parse_tuple(true);
        if (cur().kind != TK::kVarEnd) unexpected("end of print statement '}}'");
        next();
        body.push_back(std::move(s));
      } else if (t.kind == TK::kBlockBegin) {
        const Token& n = peek();
        if (n.kind != TK::kName) {
          next();
          unexpected("a statement name");
        }
        for (auto e : end_names) {
          if (n.value == e) {
            next();
            return body;
          }
        }
        next();
        body.push_back(parse_statement());
      } else {
        unexpected("template text or a tag");
      }
    }
  }

  std::unique_ptr<Stmt> parse_statement() {
    const int line = cur().line;
    NestGuard guard(this);
    const std::string name = cur().value;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    next();
    if (name == "if") {
      s->kind = Stmt::Kind::kIf;
      s->conds.push_back(parse_tuple(false));
      expect_block_end();
      while (true) {
        s->bodies.push_back(parse_body({"elif", "else", "endif"}));
        const std::string which = cur().value;
        next();
        if (which == "elif") {
          s->conds.push_back(parse_tuple(false));
          expect_block_end();
        } else if (which == "else") {
          expect_block_end();
          s->bodies.push_back(parse_body({"endif"}));
          next();
          expect_block_end();
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (name == "for") {
      s->kind = Stmt::Kind::kFor;
      s->targets = parse_names();
      if (!skip_name("in")) unexpected("'in'");
      s->expr = parse_tuple(false, /*stop_at_if=*/true);
      if (skip_name("if")) s->cond = parse_expression();
      if (is_name("recursive")) {
        fail("unsupported Jinja construct: recursive for loop", cur().line);
      }
      expect_block_end();
      ++loop_depth_;
      s->body = parse_body({"endfor", "else"});
      --loop_depth_;
      if (cur().value == "else") {
        next();
        expect_block_end();
        s->else_body = parse_body({"endfor"});
      }
      next();
      expect_block_end();
    } else if (name == "set") {
      if (cur().kind == TK::kName && peek().kind == TK::kOp && peek().value == ".") {
        s->kind = Stmt::Kind::kSet;
        s->targets.push_back(expect_name());
        next();
        s->attr = expect_name();
        expect_op("=");
        s->expr = parse_tuple(true);
        expect_block_end();
      } else {
        s->targets = parse_names();
        if (skip_op("=")) {
          s->kind = Stmt::Kind::kSet;
          s->expr = parse_tuple(true);
          expect_block_end();
        } else {
          if (s->targets.size() != 1) unexpected("'='");
          s->kind = Stmt::Kind::kBlockSet;
          if (is_op("|")) s->expr = parse_filters(placeholder(line));
          expect_block_end();
          s->body = parse_body({"endset"});
          next();
          expect_block_end();
        }
      }
    } else if (name == "macro") {
      s->kind = Stmt::Kind::kMacro;
      s->targets.push_back(expect_name());
      expect_op("(");
      while (!skip_op(")")) {
        if (!s->params.empty()) expect_op(",");
        if (skip_op(")")) break;
        s->params.push_back(expect_name());
        s->defaults.push_back(skip_op("=") ? parse_expression() : nullptr);
      }
      expect_block_end();
      s->body = parse_body({"endmacro"});
      next();
      if (cur().kind == TK::kName) next();  // {% endmacro name %}
      expect_block_end();
    } else if (name == "break" || name == "continue") {
      s->kind = name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      if (loop_depth_ == 0) fail("'" + name + "' outside of a for loop", line);
      expect_block_end();
    } else if (name == "generation") {
      s->kind = Stmt::Kind::kGeneration;
      expect_block_end();
      s->body = parse_body({"endgeneration"});
      next();
      expect_block_end();
    } else if (name == "filter") {
      s->kind = Stmt::Kind::kFilterBlock;
      s->expr = parse_filters(placeholder(line), /*first_pipe=*/false);
      expect_block_end();
      s->body = parse_body({"endfilter"});
      next();
      expect_block_end();
    } else {
      fail("unsupported Jinja construct: {% " + name + " %}", line);
    }
    return s;
  }

  std::vector<std::string> parse_names() {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    names.push_back(expect_name());
    while (skip_op(",")) {
      if (cur().kind != TK::kName) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    if (names.size() == 1 && names[0] == "in") unexpected("a loop variable");
    return names;
  }

  static ExprPtr node(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }
  static ExprPtr placeholder(int line) { return node(Expr::Kind::kConst, line); }

  bool tuple_end() const {
    return cur().kind == TK::kVarEnd || cur().kind == TK::kBlockEnd || is_op(")") ||
           cur().kind == TK::kEnd;
  }

  // Expression or bare tuple `a, b`. with_condexpr false: no inline if (if/for headers).
  ExprPtr parse_tuple(bool with_condexpr, bool stop_at_if = false, bool explicit_parens = false) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        comma = true;
      }
      if (tuple_end() || (stop_at_if && is_name("if"))) break;
      items.push_back(with_condexpr ? parse_expression() : parse_or());
      if (!is_op(",")) break;
    }
    if (!comma && items.size() == 1) return std::move(items[0]);
    if (items.empty() && !explicit_parens) unexpected("an expression");
    auto t = node(Expr::Kind::kTuple, line);
    t->kids = std::move(items);
    return t;
  }

  ExprPtr parse_expression() {
    NestGuard guard(this);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const int line = cur().line;
      next();
      auto c = node(Expr::Kind::kCond, line);
      ExprPtr test = parse_or();
      ExprPtr other = skip_name("else") ? parse_expression() : nullptr;
      c->kids.push_back(std::move(e));
      c->kids.push_back(std::move(test));
      c->kids.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind k, ExprPtr a, ExprPtr b, int line, std::string op = {}) {
    auto e = node(k, line);
    e->name = std::move(op);
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const int line = cur().line;
      next();
      e = binary(Expr::Kind::kOr, std::move(e), parse_and(), line);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const int line = cur().line;
      next();
      e = binary(Expr::Kind::kAnd, std::move(e), parse_not(), line);
    }
    return e;
  }
  ExprPtr parse_not() {
    NestGuard guard(this);
    if (is_name("not")) {
      auto e = node(Expr::Kind::kNot, cur().line);
      next();
      e->kids.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    auto c = node(Expr::Kind::kCompare, line);
    c->kids.push_back(std::move(first));
    while (true) {
      if (cur().kind == TK::kOp &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">="))) {
        c->ops.push_back(cur().value);
        next();
      } else if (is_name("in")) {
        c->ops.push_back("in");
        next();
      } else if (is_name("not") && peek().kind == TK::kName && peek().value == "in") {
        c->ops.push_back("notin");
        next();
        next();
      } else {
        break;
      }
      c->kids.push_back(parse_math1());
    }
    if (c->ops.empty()) return std::move(c->kids[0]);
    return c;
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().value;
      const int line = cur().line;
      next();
      e = binary(Expr::Kind::kBinary, std::move(e), parse_concat(), line, op);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const int line = cur().line;
      next();
      e = binary(Expr::Kind::kBinary, std::move(e), parse_math2(), line, "~");
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().value;
      const int line = cur().line;
      next();
      e = binary(Expr::Kind::kBinary, std::move(e), parse_pow(), line, op);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      next();
      e = binary(Expr::Kind::kBinary, std::move(e), parse_unary(true), line, "**");
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    const int line = cur().line;
    NestGuard guard(this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = node(is_op("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, line);
      next();
      e->kids.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filters(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    if (t.kind == TK::kName) {
      auto e = node(Expr::Kind::kConst, line);
      if (t.value == "true" || t.value == "True") {
        e->value = Value::boolean(true);
      } else if (t.value == "false" || t.value == "False") {
        e->value = Value::boolean(false);
      } else if (t.value == "none" || t.value == "None") {
        e->value = Value::none();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.value;
      }
      next();
      return e;
    }
    if (t.kind == TK::kString) {
      std::string s;
      while (cur().kind == TK::kString) {
        s += cur().value;
        next();
      }
      auto e = node(Expr::Kind::kConst, line);
      e->value = Value::string(std::move(s));
      return e;
    }
    if (t.kind == TK::kInt || t.kind == TK::kFloat) {
      auto e = node(Expr::Kind::kConst, line);
      if (t.kind == TK::kInt) {
        errno = 0;
        long long v = std::strtoll(t.value.c_str(), nullptr, 10);
        if (errno == ERANGE) fail("integer literal out of range: " + t.value, line);
        e->value = Value::integer(v);
      } else {
        e->value = Value::real(std::strtod(t.value.c_str(), nullptr));
      }
      next();
      return e;
    }
    if (skip_op("(")) {
      ExprPtr e = parse_tuple(true, false, true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto e = node(Expr::Kind::kList, line);
      while (!skip_op("]")) {
        if (!e->kids.empty()) expect_op(",");
        if (skip_op("]")) break;
        e->kids.push_back(parse_expression());
      }
      return e;
    }
    if (skip_op("{")) {
      auto e = node(Expr::Kind::kDict, line);
      while (!skip_op("}")) {
        if (!e->kids.empty()) expect_op(",");
        if (skip_op("}")) break;
        e->kids.push_back(parse_expression());
        expect_op(":");
        e->kids.push_back(parse_expression());
      }
      return e;
    }
    unexpected("an expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const int line = cur().line;
      if (skip_op(".")) {
        if (cur().kind == TK::kInt) {
          auto item = node(Expr::Kind::kItem, line);
          auto idx = node(Expr::Kind::kConst, line);
          idx->value = Value::integer(std::strtoll(cur().value.c_str(), nullptr, 10));
          next();
          item->kids.push_back(std::move(e));
          item->kids.push_back(std::move(idx));
          e = std::move(item);
        } else {
          auto a = node(Expr::Kind::kAttr, line);
          a->name = expect_name();
          a->kids.push_back(std::move(e));
          e = std::move(a);
        }
      } else if (skip_op("[")) {
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, int line) {
    ExprPtr parts[3];
    bool slice = false;
    if (!is_op(":")) parts[0] = parse_expression();
    if (skip_op(":")) {
      slice = true;
      if (!is_op("]") && !is_op(":")) parts[1] = parse_expression();
      if (skip_op(":")) {
        if (!is_op("]")) parts[2] = parse_expression();
      }
    }
    if (!slice && is_op(",")) {  // x[a, b]: a tuple key (never found: keys are strings or ints)
      auto t = node(Expr::Kind::kTuple, line);
      t->kids.push_back(std::move(parts[0]));
      while (skip_op(",")) {
        if (is_op("]")) break;
        t->kids.push_back(parse_expression());
      }
      parts[0] = std::move(t);
    }
    expect_op("]");
    auto e = node(slice ? Expr::Kind::kSlice : Expr::Kind::kItem, line);
    e->kids.push_back(std::move(obj));
    if (slice) {
      for (auto& p : parts) e->kids.push_back(std::move(p));
    } else {
      e->kids.push_back(std::move(parts[0]));
    }
    return e;
  }

  // Reads `( args )` into e's kids[1..] / arg_names.
  void parse_args(Expr* e) {
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (skip_op(")")) break;
      if (is_op("*") || is_op("**")) {
        fail("unsupported Jinja construct: *args / **kwargs in a call", cur().line);
      }
      if (cur().kind == TK::kName && peek().kind == TK::kOp && peek().value == "=") {
        e->arg_names.push_back(cur().value);
        next();
        next();
      } else {
        if (!e->arg_names.empty() && !e->arg_names.back().empty()) {
          fail("positional argument after a keyword argument", cur().line);
        }
        e->arg_names.emplace_back();
      }
      e->kids.push_back(parse_expression());
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(Expr::Kind::kCall, cur().line);
    e->kids.push_back(std::move(callee));
    parse_args(e.get());
    return e;
  }

  std::string dotted_name() {
    std::string n = expect_name();
    while (is_op(".") && peek().kind == TK::kName) {
      next();
      n += '.';
      n += expect_name();
    }
    return n;
  }

  ExprPtr parse_filters(ExprPtr e, bool first_pipe = true) {
    bool need_pipe = first_pipe;
    while (true) {
      const int line = cur().line;
      if (!need_pipe || is_op("|")) {
        if (need_pipe) next();
        need_pipe = true;
        auto f = node(Expr::Kind::kFilter, line);
        f->name = dotted_name();
        f->kids.push_back(std::move(e));
        if (is_op("(")) parse_args(f.get());
        e = std::move(f);
      } else if (is_name("is")) {
        next();
        auto t = node(Expr::Kind::kTest, line);
        t->negated = skip_name("not");
        t->name = dotted_name();
        t->kids.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(t.get());
        } else if ((cur().kind == TK::kName && !is_name("else") && !is_name("or") &&
                    !is_name("and")) ||
                   cur().kind == TK::kString || cur().kind == TK::kInt ||
                   cur().kind == TK::kFloat || is_op("(") || is_op("[") || is_op("{")) {
          ExprPtr arg = parse_postfix(parse_primary());
          t->arg_names.emplace_back();
          t->kids.push_back(std::move(arg));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // Bounds the recursion of nested expressions and blocks (the interpreter recurses as deep).
  struct NestGuard {
    explicit NestGuard(Parser* p) : p(p) {
      if (++p->nest_ > kMaxNesting) fail("template nesting too deep", p->cur().line);
    }
    ~NestGuard() { --p->nest_; }
    Parser* p;
  };
  static constexpr int kMaxNesting = 768;  // three per parenthesis level

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int nest_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

ParsedTemplate parse(std::string_view source) { return Parser(tokenize(source)).run(); }

}  // namespace loom::jinja
