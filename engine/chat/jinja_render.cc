#include "engine/chat/jinja_render.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "engine/chat/jinja_builtins.h"
#include "engine/chat/jinja_parser.h"

namespace loom::jinja {
namespace {

struct Frame {
  Dict vars;
  const Frame* parent = nullptr;
};

enum class Flow { kNormal, kBreak, kContinue };

constexpr int kMaxCallDepth = 200;
constexpr size_t kMaxOutput = size_t(256) << 20;
// Loop iterations and macro calls of one render: far above what any conversation needs, low
// enough that a runaway template fails in well under a second.
constexpr int64_t kMaxSteps = int64_t(1) << 20;

class Interpreter {
 public:
  Interpreter(const Dict& context) {
    builtins_.vars = make_globals();
    root_.vars = context;
    root_.parent = &builtins_;
  }

  // The text and its request ranges.
  std::pair<std::string, Ranges> run(const Body& body) {
    Buffer out;
    out_ = &out;
    exec_body(body, root_);
    return {std::move(out.text), std::move(out.ranges)};
  }

 private:
  static Value lookup(const Frame& f, const std::string& name) {
    for (const Frame* p = &f; p != nullptr; p = p->parent) {
      if (const Value* v = p->vars.find(name)) return *v;
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  void step(int line) {
    if (++steps_ > kMaxSteps) {
      fail("template exceeds " + std::to_string(kMaxSteps) + " loop iterations and macro calls",
           line);
    }
  }

  // Template text.
  void emit(std::string_view s) {
    out_->text.append(s);
    if (out_->text.size() > kMaxOutput) fail("rendered text exceeds 256 MiB");
  }
  // A value's text, with its request ranges.
  void emit_value(const Value& v) {
    Ranges r;
    std::string s = to_str_tracked(v, &r);
    append_tracked(&out_->text, &out_->ranges, s, r);
    if (out_->text.size() > kMaxOutput) fail("rendered text exceeds 256 MiB");
  }

  // A built-in's result computed from request text carries it (conservatively, as a whole).
  static Value provenance(Value result, const Value* self, const Value* operand,
                          const CallArgs& args) {
    if (result.kind != Value::Kind::kString && result.kind != Value::Kind::kList) return result;
    bool from_request =
        (self && has_request_text(*self)) || (operand && has_request_text(*operand));
    for (const Value& a : args.args) from_request = from_request || has_request_text(a);
    for (const auto& kv : args.kwargs) from_request = from_request || has_request_text(kv.second);
    return from_request ? mark_request(result) : result;
  }

  Flow exec_body(const Body& body, Frame& frame) {
    for (const auto& s : body) {
      Flow f = exec(*s, frame);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& s, Frame& frame) {
    try {
      return exec_inner(s, frame);
    } catch (Error& e) {
      if (e.line == 0) e.line = s.line;
      throw;
    }
  }

  void assign(Frame& frame, const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      frame.vars.set(targets[0], v);
      return;
    }
    std::vector<Value> items = iterate(v);
    if (items.size() != targets.size()) {
      fail("cannot unpack " + std::to_string(items.size()) + " values into " +
               std::to_string(targets.size()) + " names",
           line);
    }
    for (size_t k = 0; k < targets.size(); ++k) frame.vars.set(targets[k], items[k]);
  }

  Value capture(const Body& body, Frame& frame) {
    Buffer buf;
    Buffer* saved = out_;
    out_ = &buf;
    try {
      exec_body(body, frame);
    } catch (...) {
      out_ = saved;
      throw;
    }
    out_ = saved;
    return tracked_string(std::move(buf.text), std::move(buf.ranges));
  }

  // Applies a filter chain parsed around a placeholder (kConst with Undefined) to `v`.
  Value apply_chain(const Expr& chain, const Value& v, Frame& frame) {
    if (chain.kind != Expr::Kind::kFilter) return v;
    Value inner = apply_chain(*chain.kids[0], v, frame);
    CallArgs args = eval_args(chain, frame);
    return provenance(apply_filter(chain.name, inner, args), nullptr, &inner, args);
  }

  Flow exec_inner(const Stmt& s, Frame& frame) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        emit(s.text);
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        emit_value(eval(*s.expr, frame));
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (size_t k = 0; k < s.conds.size(); ++k) {
          if (eval(*s.conds[k], frame).truthy()) return exec_body(s.bodies[k], frame);
        }
        if (s.bodies.size() > s.conds.size()) return exec_body(s.bodies.back(), frame);
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        exec_for(s, frame);
        return Flow::kNormal;
      case Stmt::Kind::kSet: {
        Value v = eval(*s.expr, frame);
        if (!s.attr.empty()) {
          Value ns = lookup(frame, s.targets[0]);
          if (ns.kind != Value::Kind::kNamespace) {
            fail("cannot assign attribute on non-namespace object '" + s.targets[0] + "'", s.line);
          }
          ns.dict->set(s.attr, std::move(v));
        } else {
          assign(frame, s.targets, v, s.line);
        }
        return Flow::kNormal;
      }
      case Stmt::Kind::kBlockSet: {
        Value v = capture(s.body, frame);
        if (s.expr) v = apply_chain(*s.expr, v, frame);
        frame.vars.set(s.targets[0], v);
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        frame.vars.set(s.targets[0], make_macro(s));
        return Flow::kNormal;
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kGeneration:
        return exec_body(s.body, frame);
      case Stmt::Kind::kFilterBlock: {
        Value v = capture(s.body, frame);
        emit_value(apply_chain(*s.expr, v, frame));
        return Flow::kNormal;
      }
    }
    return Flow::kNormal;
  }

  void exec_for(const Stmt& s, Frame& frame) {
    std::vector<Value> all = iterate(eval(*s.expr, frame));
    std::vector<Value> items;
    if (s.cond) {
      for (const Value& v : all) {
        Frame f;
        f.parent = &frame;
        assign(f, s.targets, v, s.line);
        if (eval(*s.cond, f).truthy()) items.push_back(v);
      }
    } else {
      items = std::move(all);
    }
    // jinja2 runs `else` unless some iteration reached the end of the body: after an empty loop,
    // and also when every iteration ended in `continue` or the first one in `break`.
    bool run_else = true;
    const int64_t n = int64_t(items.size());
    // One `loop` object per loop, updated in place each iteration (as jinja2's LoopContext).
    enum { kIndex, kIndex0, kRevindex, kRevindex0, kFirst, kLast, kPrev, kNext, kKeys };
    auto index = std::make_shared<int64_t>(0);
    Dict proto;
    for (const char* key :
         {"index", "index0", "revindex", "revindex0", "first", "last", "previtem", "nextitem"}) {
      proto.items.emplace_back(key, Value());
    }
    proto.set("length", Value::integer(n));
    proto.set("depth", Value::integer(1));
    proto.set("depth0", Value::integer(0));
    proto.set("cycle", Value::function("loop.cycle", [index](CallArgs& a) {
                if (a.args.empty()) fail("no items for cycling given");
                return a.args[size_t(*index) % a.args.size()];
              }));
    const Value loop = Value::make_dict(std::move(proto));
    auto& slots = loop.dict->items;
    for (int64_t k = 0; k < n; ++k) {
      step(s.line);
      *index = k;
      slots[kIndex].second = Value::integer(k + 1);
      slots[kIndex0].second = Value::integer(k);
      slots[kRevindex].second = Value::integer(n - k);
      slots[kRevindex0].second = Value::integer(n - k - 1);
      slots[kFirst].second = Value::boolean(k == 0);
      slots[kLast].second = Value::boolean(k == n - 1);
      slots[kPrev].second =
          k > 0 ? items[size_t(k - 1)] : Value::undefined("there is no previous item");
      slots[kNext].second =
          k + 1 < n ? items[size_t(k + 1)] : Value::undefined("there is no next item");
      Frame f;
      f.parent = &frame;
      f.vars.items.emplace_back("loop", loop);
      assign(f, s.targets, items[size_t(k)], s.line);
      const Flow flow = exec_body(s.body, f);
      if (flow == Flow::kBreak) break;
      if (flow == Flow::kNormal) run_else = false;
    }
    if (run_else && !s.else_body.empty()) {
      Frame f;
      f.parent = &frame;
      exec_body(s.else_body, f);
    }
  }

  Value make_macro(const Stmt& s) {
    const Stmt* m = &s;
    Value fn = Value::function(s.targets[0], [this, m](CallArgs& a) {
      if (++depth_ > kMaxCallDepth) fail("macro calls nested too deeply", a.line);
      step(a.line);
      Frame f;
      f.parent = &root_;
      if (a.args.size() > m->params.size()) {
        fail("macro '" + m->targets[0] + "' takes no more than " +
                 std::to_string(m->params.size()) + " argument(s)",
             a.line);
      }
      for (size_t k = 0; k < m->params.size(); ++k) {
        Value v;
        bool given = false;
        if (k < a.args.size()) {
          v = a.args[k];
          given = true;
        }
        for (const auto& [name, kv] : a.kwargs) {
          if (name == m->params[k]) {
            if (given)
              fail("macro '" + m->targets[0] + "' got multiple values for argument '" + name + "'",
                   a.line);
            v = kv;
            given = true;
          }
        }
        if (!given) {
          v = m->defaults[k] ? eval(*m->defaults[k], f)
                             : Value::undefined("'" + m->params[k] + "' is undefined");
        }
        f.vars.set(m->params[k], v);
      }
      for (const auto& [name, kv] : a.kwargs) {
        if (std::find(m->params.begin(), m->params.end(), name) == m->params.end()) {
          fail("macro '" + m->targets[0] + "' takes no keyword argument '" + name + "'", a.line);
        }
      }
      Value text = capture(m->body, f);
      --depth_;
      return text;
    });
    fn.macro = true;
    return fn;
  }

  CallArgs eval_args(const Expr& e, Frame& frame) {
    CallArgs a;
    a.line = e.line;
    for (size_t k = 1; k < e.kids.size(); ++k) {
      Value v = eval(*e.kids[k], frame);
      const std::string& name = e.arg_names[k - 1];
      if (name.empty()) {
        a.args.push_back(std::move(v));
      } else {
        a.kwargs.emplace_back(name, std::move(v));
      }
    }
    return a;
  }

  Value eval(const Expr& e, Frame& frame) {
    try {
      return eval_inner(e, frame);
    } catch (Error& err) {
      if (err.line == 0) err.line = e.line;
      throw;
    }
  }

  Value eval_inner(const Expr& e, Frame& frame) {
    using EK = Expr::Kind;
    switch (e.kind) {
      case EK::kConst:
        return e.value;
      case EK::kName:
        return lookup(frame, e.name);
      case EK::kList:
      case EK::kTuple: {
        List items;
        for (const auto& k : e.kids) items.push_back(eval(*k, frame));
        return Value::make_list(std::move(items), e.kind == EK::kTuple);
      }
      case EK::kDict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
          Value key = eval(*e.kids[k], frame);
          if (!key.is_string()) fail("dict literal keys must be strings, not " + key.type_name());
          d.keys_from_request = d.keys_from_request || key.req != nullptr;
          d.set(key.s, eval(*e.kids[k + 1], frame));
        }
        return Value::make_dict(std::move(d));
      }
      case EK::kAttr:
        return get_attr(eval(*e.kids[0], frame), e.name);
      case EK::kItem:
        return get_item(eval(*e.kids[0], frame), eval(*e.kids[1], frame));
      case EK::kSlice: {
        Value obj = eval(*e.kids[0], frame);
        Value parts[3];
        const Value* ptr[3] = {nullptr, nullptr, nullptr};
        for (int k = 0; k < 3; ++k) {
          if (e.kids[k + 1]) {
            parts[k] = eval(*e.kids[k + 1], frame);
            ptr[k] = &parts[k];
          }
        }
        return get_slice(obj, ptr[0], ptr[1], ptr[2]);
      }
      case EK::kCall: {
        Value callee = eval(*e.kids[0], frame);
        if (callee.is_undefined()) fail(callee.s.empty() ? "undefined value called" : callee.s);
        if (callee.kind != Value::Kind::kFunction) {
          fail("'" + callee.type_name() + "' object is not callable");
        }
        CallArgs args = eval_args(e, frame);
        if (callee.macro) return (*callee.fn)(args);
        return provenance((*callee.fn)(args), callee.self.get(), nullptr, args);
      }
      case EK::kFilter: {
        Value v = eval(*e.kids[0], frame);
        CallArgs args = eval_args(e, frame);
        return provenance(apply_filter(e.name, v, args), nullptr, &v, args);
      }
      case EK::kTest: {
        Value v = eval(*e.kids[0], frame);
        CallArgs args = eval_args(e, frame);
        return Value::boolean(apply_test(e.name, v, args) != e.negated);
      }
      case EK::kNeg:
      case EK::kPos:
        return negate(eval(*e.kids[0], frame), e.kind == EK::kNeg);
      case EK::kNot:
        return Value::boolean(!eval(*e.kids[0], frame).truthy());
      case EK::kBinary:
        return binary_op(e.name, eval(*e.kids[0], frame), eval(*e.kids[1], frame));
      case EK::kAnd: {
        Value a = eval(*e.kids[0], frame);
        return a.truthy() ? eval(*e.kids[1], frame) : a;
      }
      case EK::kOr: {
        Value a = eval(*e.kids[0], frame);
        return a.truthy() ? a : eval(*e.kids[1], frame);
      }
      case EK::kCompare: {
        Value left = eval(*e.kids[0], frame);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.kids[k + 1], frame);
          const std::string& op = e.ops[k];
          bool ok;
          if (op == "==") {
            ok = equals(left, right);
          } else if (op == "!=") {
            ok = !equals(left, right);
          } else if (op == "in") {
            ok = contains(right, left);
          } else if (op == "notin") {
            ok = !contains(right, left);
          } else {
            ok = ordered_compare(op, left, right);
          }
          if (!ok) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case EK::kCond:
        if (eval(*e.kids[1], frame).truthy()) return eval(*e.kids[0], frame);
        return e.kids[2] ? eval(*e.kids[2], frame) : Value::undefined("inline if without else");
    }
    return Value::undefined();
  }

  struct Buffer {
    std::string text;
    Ranges ranges;
  };

  Frame builtins_;
  Frame root_;
  Buffer* out_ = nullptr;
  int depth_ = 0;
  int64_t steps_ = 0;
};

absl::Status to_status(const Error& e) {
  std::string msg = "chat template";
  if (e.line > 0) msg += " line " + std::to_string(e.line);
  return absl::InvalidArgumentError(msg + ": " + e.message);
}

}  // namespace

absl::StatusOr<Template> Template::parse(std::string_view source) {
  try {
    Template t;
    t.tree_ = std::make_shared<const ParsedTemplate>(jinja::parse(source));
    return t;
  } catch (const Error& e) {
    return to_status(e);
  }
}

absl::StatusOr<std::string> Template::render(const Dict& context) const {
  auto r = render_tracked(context);
  if (!r.ok()) return r.status();
  return std::move(r->text);
}

absl::StatusOr<TrackedText> Template::render_tracked(const Dict& context) const {
  try {
    Interpreter in(context);
    auto [text, ranges] = in.run(tree_->body);
    return TrackedText{std::move(text), std::move(ranges)};
  } catch (const Error& e) {
    return to_status(e);
  }
}

}  // namespace loom::jinja
