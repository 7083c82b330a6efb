#include "worker/chat/jinja_eval.h"

#include <deque>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/chat/jinja_access.h"
#include "worker/chat/jinja_builtins.h"
#include "worker/chat/python_str.h"

namespace vc::jinja {
namespace {

// Macro calls nested deeper than this fail, rather than exhaust the stack.
constexpr int kMaxCallDepth = 100;

class Scope {
 public:
  explicit Scope(const Scope* parent) : parent_(parent) {}

  const Value* Find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent_) {
      const auto it = s->variables_.find(name);
      if (it != s->variables_.end()) return &it->second;
    }
    return nullptr;
  }

  void Set(const std::string& name, Value value) { variables_[name] = std::move(value); }

 private:
  const Scope* parent_;
  absl::flat_hash_map<std::string, Value> variables_;
};

// How a body ended: normally, or at a break or continue for the loop around it.
enum class Flow { kNormal, kBreak, kContinue };

// The `loop` of a for loop, updated as the loop moves on.
class Loop final : public Object, public std::enable_shared_from_this<Loop> {
 public:
  explicit Loop(std::vector<Value> items) : items_(std::move(items)) {}

  void set_index0(size_t i) { index0_ = i; }

  std::string TypeName() const override { return "LoopContext"; }
  std::string TypeRepr() const override { return "jinja2.runtime.LoopContext object"; }

  std::optional<Value> Attribute(const std::string& name) const override {
    const auto length = static_cast<int64_t>(items_.size());
    const auto index0 = static_cast<int64_t>(index0_);
    if (name == "index0") return Value::Int(index0);
    if (name == "index") return Value::Int(index0 + 1);
    if (name == "revindex0") return Value::Int(length - index0 - 1);
    if (name == "revindex") return Value::Int(length - index0);
    if (name == "first") return Value::Bool(index0 == 0);
    if (name == "last") return Value::Bool(index0 + 1 == length);
    if (name == "length") return Value::Int(length);
    if (name == "depth") return Value::Int(1);
    if (name == "depth0") return Value::Int(0);
    if (name == "previtem") return index0 > 0 ? items_[index0_ - 1] : Value::Undefined("there is no previous item");
    if (name == "nextitem") {
      return index0 + 1 < length ? items_[index0_ + 1] : Value::Undefined("there is no next item");
    }
    if (name == "cycle" || name == "changed") {
      std::shared_ptr<const Loop> self = shared_from_this();
      const bool cycle = name == "cycle";
      return Value::FromObject(std::make_shared<Function>(
          name, [self, cycle](CallArgs args) { return cycle ? self->Cycle(args) : self->Changed(args); }));
    }
    return std::nullopt;
  }

  absl::StatusOr<std::string> Repr() const override {
    return absl::StrCat("<LoopContext ", index0_ + 1, "/", items_.size(), ">");
  }
  absl::StatusOr<int64_t> Length() const override { return static_cast<int64_t>(items_.size()); }
  bool iterable() const override { return true; }
  bool callable() const override { return true; }
  absl::StatusOr<Value> Call(CallArgs) const override {
    return TypeError("The loop must have the 'recursive' marker to be called recursively.");
  }

 private:
  absl::StatusOr<Value> Cycle(const CallArgs& args) const {
    if (!args.keyword.empty()) return TypeError("cycle() got an unexpected keyword argument");
    if (args.positional.empty()) return TypeError("no items for cycling given");
    return args.positional[index0_ % args.positional.size()];
  }

  // Whether the arguments differ from the last call's (true on the first call).
  absl::StatusOr<Value> Changed(const CallArgs& args) const {
    if (!args.keyword.empty()) return TypeError("changed() got an unexpected keyword argument");
    Value values = Value::Tuple(args.positional);
    if (last_changed_.has_value() && Equal(*last_changed_, values)) return Value::Bool(false);
    last_changed_ = std::move(values);
    return Value::Bool(true);
  }

  const std::vector<Value> items_;
  size_t index0_ = 0;
  mutable std::optional<Value> last_changed_;
};

class Renderer;

// A macro (or a call block's caller), with the scope it was defined in.
class MacroObject final : public Object {
 public:
  MacroObject(const stmt::Macro& macro, Scope* scope, Renderer* renderer)
      : macro_(macro), scope_(scope), renderer_(renderer) {}

  std::string TypeName() const override { return "Macro"; }
  std::string TypeRepr() const override { return "jinja2.runtime.Macro object"; }
  std::optional<Value> Attribute(const std::string& name) const override {
    if (name == "name") return Value::String(macro_.name);
    if (name == "arguments") {
      std::vector<Value> names;
      for (const Param& p : macro_.params) names.push_back(Value::String(p.name));
      return Value::Tuple(std::move(names));
    }
    if (name == "catch_kwargs") return Value::Bool(macro_.takes_kwargs);
    if (name == "catch_varargs") return Value::Bool(macro_.takes_varargs);
    if (name == "caller") return Value::Bool(macro_.takes_caller);
    return std::nullopt;
  }
  absl::StatusOr<std::string> Repr() const override { return absl::StrCat("<Macro ", python::Repr(macro_.name), ">"); }
  bool callable() const override { return true; }
  absl::StatusOr<Value> Call(CallArgs args) const override;

 private:
  const stmt::Macro& macro_;
  Scope* scope_;
  Renderer* renderer_;
};

class Renderer {
 public:
  Scope* NewScope(const Scope* parent) { return &scopes_.emplace_back(parent); }

  absl::Status ExecBody(const Body& body, Scope* scope, std::string* out, Flow* flow) {
    for (const Stmt& s : body) {
      VC_RETURN_IF_ERROR(std::visit([&](const auto& node) { return Exec(node, scope, out, flow); }, s.node));
      if (*flow != Flow::kNormal) break;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Value> Eval(const Expr& e, Scope* scope) {
    return std::visit([&](const auto& node) { return EvalNode(node, e.at, scope); }, e.node);
  }

  absl::StatusOr<Value> CallMacro(const stmt::Macro& macro, Scope* defined_in, CallArgs args) {
    if (call_depth_ >= kMaxCallDepth) return absl::InvalidArgumentError("macro calls nested too deeply");
    ++call_depth_;
    absl::StatusOr<Value> result = InvokeMacro(macro, defined_in, std::move(args));
    --call_depth_;
    return result;
  }

 private:
  // ------------------------------------------------------------------------- statements

  absl::Status Exec(const stmt::Text& text, Scope*, std::string* out, Flow*) {
    out->append(text.text);
    return absl::OkStatus();
  }

  absl::Status Exec(const stmt::Output& output, Scope* scope, std::string* out, Flow*) {
    VC_ASSIGN_OR_RETURN(const Value v, Eval(*output.value, scope));
    VC_ASSIGN_OR_RETURN(const std::string s, Str(v));
    out->append(s);
    return absl::OkStatus();
  }

  absl::Status Exec(const stmt::If& node, Scope* scope, std::string* out, Flow* flow) {
    for (const auto& [test, body] : node.branches) {
      VC_ASSIGN_OR_RETURN(const Value v, Eval(*test, scope));
      if (Truthy(v)) return ExecBody(body, scope, out, flow);
    }
    return ExecBody(node.otherwise, scope, out, flow);
  }

  absl::Status Exec(const stmt::For& node, Scope* scope, std::string* out, Flow* flow) {
    VC_ASSIGN_OR_RETURN(const Value iterable, Eval(*node.iterable, scope));
    VC_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(iterable));
    if (node.condition != nullptr) {
      std::vector<Value> kept;
      for (Value& item : items) {
        Scope* test_scope = NewScope(scope);
        VC_RETURN_IF_ERROR(Assign(node.target, item, test_scope));
        VC_ASSIGN_OR_RETURN(const Value keep, Eval(*node.condition, test_scope));
        if (Truthy(keep)) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const auto loop = std::make_shared<Loop>(items);
    const Value loop_value = Value::FromObject(loop);
    bool body_completed = false;
    for (size_t i = 0; i < items.size(); ++i) {
      loop->set_index0(i);
      Scope* iteration = NewScope(scope);
      iteration->Set("loop", loop_value);
      VC_RETURN_IF_ERROR(Assign(node.target, items[i], iteration));
      Flow body_flow = Flow::kNormal;
      VC_RETURN_IF_ERROR(ExecBody(node.body, iteration, out, &body_flow));
      body_completed = body_completed || body_flow == Flow::kNormal;
      if (body_flow == Flow::kBreak) break;
    }
    // jinja2 runs the else block unless the body once ran to its end (so also after a break or
    // continue in every iteration). A break or continue in it belongs to the loop around this one.
    if (body_completed) return absl::OkStatus();
    return ExecBody(node.otherwise, NewScope(scope), out, flow);
  }

  absl::Status Exec(const stmt::Set& node, Scope* scope, std::string*, Flow*) {
    VC_ASSIGN_OR_RETURN(Value v, Eval(*node.value, scope));
    return Assign(node.target, std::move(v), scope);
  }

  // The text of `body` (in a scope of its own) through `filters`.
  absl::StatusOr<Value> RenderFiltered(const Body& body, const std::vector<FilterCall>& filters, Scope* scope,
                                       Flow* flow) {
    std::string text;
    VC_RETURN_IF_ERROR(ExecBody(body, NewScope(scope), &text, flow));
    Value v = Value::String(std::move(text));
    for (const FilterCall& f : filters) {
      VC_ASSIGN_OR_RETURN(v, ApplyFilter(f, std::move(v), scope));
    }
    return v;
  }

  absl::Status Exec(const stmt::SetBlock& node, Scope* scope, std::string*, Flow* flow) {
    VC_ASSIGN_OR_RETURN(Value v, RenderFiltered(node.body, node.filters, scope, flow));
    if (*flow != Flow::kNormal) return absl::OkStatus();
    return Assign(node.target, std::move(v), scope);
  }

  absl::Status Exec(const stmt::FilterBlock& node, Scope* scope, std::string* out, Flow* flow) {
    VC_ASSIGN_OR_RETURN(const Value v, RenderFiltered(node.body, node.filters, scope, flow));
    if (*flow != Flow::kNormal) return absl::OkStatus();
    VC_ASSIGN_OR_RETURN(const std::string s, Str(v));
    out->append(s);
    return absl::OkStatus();
  }

  absl::Status Exec(const stmt::Macro& macro, Scope* scope, std::string*, Flow*) {
    scope->Set(macro.name, Value::FromObject(std::make_shared<MacroObject>(macro, scope, this)));
    return absl::OkStatus();
  }

  absl::Status Exec(const stmt::CallBlock& node, Scope* scope, std::string* out, Flow*) {
    const auto& call = std::get<expr::Call>(node.call->node);
    VC_ASSIGN_OR_RETURN(const Value callee, Eval(*call.callee, scope));
    VC_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(call.args, scope));
    args.keyword.emplace_back("caller", Value::FromObject(std::make_shared<MacroObject>(node.caller, scope, this)));
    VC_ASSIGN_OR_RETURN(const Value result, CallValue(callee, std::move(args)));
    VC_ASSIGN_OR_RETURN(const std::string s, Str(result));
    out->append(s);
    return absl::OkStatus();
  }

  absl::Status Exec(const stmt::With& node, Scope* scope, std::string* out, Flow* flow) {
    std::vector<Value> values;
    for (const auto& assignment : node.assignments) {
      VC_ASSIGN_OR_RETURN(Value v, Eval(*assignment.second, scope));
      values.push_back(std::move(v));
    }
    Scope* inner = NewScope(scope);
    for (size_t i = 0; i < values.size(); ++i) VC_RETURN_IF_ERROR(Assign(node.assignments[i].first, values[i], inner));
    return ExecBody(node.body, inner, out, flow);
  }

  absl::Status Exec(const stmt::Break&, Scope*, std::string*, Flow* flow) {
    *flow = Flow::kBreak;
    return absl::OkStatus();
  }

  absl::Status Exec(const stmt::Continue&, Scope*, std::string*, Flow* flow) {
    *flow = Flow::kContinue;
    return absl::OkStatus();
  }

  absl::Status Assign(const Target& target, Value v, Scope* scope) {
    if (!target.attribute.empty()) {
      const Value* ns = scope->Find(target.names[0]);
      auto* n = ns != nullptr && ns->is_object() ? dynamic_cast<Namespace*>(&ns->object()) : nullptr;
      if (n == nullptr) return absl::InvalidArgumentError("cannot assign attribute on non-namespace object");
      n->Set(target.attribute, std::move(v));
      return absl::OkStatus();
    }
    if (!target.unpack) {
      scope->Set(target.names[0], std::move(v));
      return absl::OkStatus();
    }
    absl::StatusOr<std::vector<Value>> items = Iterate(v);
    if (!items.ok()) return TypeError(absl::StrCat("cannot unpack non-iterable ", TypeName(v), " object"));
    const size_t n = target.names.size();
    if (items->size() < n) {
      return absl::InvalidArgumentError(
          absl::StrCat("not enough values to unpack (expected ", n, ", got ", items->size(), ")"));
    }
    if (items->size() > n) {
      return absl::InvalidArgumentError(absl::StrCat("too many values to unpack (expected ", n, ")"));
    }
    for (size_t i = 0; i < n; ++i) scope->Set(target.names[i], std::move((*items)[i]));
    return absl::OkStatus();
  }

  // ------------------------------------------------------------------------- expressions

  absl::StatusOr<CallArgs> EvalArgs(const ArgExprs& args, Scope* scope) {
    CallArgs call;
    for (const ExprPtr& e : args.positional) {
      VC_ASSIGN_OR_RETURN(Value v, Eval(*e, scope));
      call.positional.push_back(std::move(v));
    }
    for (const auto& [key, e] : args.keyword) {
      VC_ASSIGN_OR_RETURN(Value v, Eval(*e, scope));
      call.keyword.emplace_back(key, std::move(v));
    }
    return call;
  }

  static absl::StatusOr<Value> CallValue(const Value& callee, CallArgs args) {
    if (callee.is_undefined()) return absl::InvalidArgumentError(callee.undefined_message());
    if (!callee.is_object() || !callee.object().callable()) {
      return TypeError(absl::StrCat("'", TypeName(callee), "' object is not callable"));
    }
    return callee.object().Call(std::move(args));
  }

  absl::StatusOr<Value> ApplyFilter(const FilterCall& f, Value v, Scope* scope) {
    VC_ASSIGN_OR_RETURN(const CallArgs args, EvalArgs(f.args, scope));
    return f.filter->apply(v, args);
  }

  absl::StatusOr<Value> EvalNode(const expr::Literal& node, Location, Scope*) { return node.value; }

  absl::StatusOr<Value> EvalNode(const expr::Name& node, Location, Scope* scope) {
    const Value* v = scope->Find(node.name);
    if (v == nullptr) return Value::Undefined(absl::StrCat(python::Repr(node.name), " is undefined"));
    return *v;
  }

  absl::StatusOr<std::vector<Value>> EvalAll(const std::vector<ExprPtr>& exprs, Scope* scope) {
    std::vector<Value> values;
    values.reserve(exprs.size());
    for (const ExprPtr& e : exprs) {
      VC_ASSIGN_OR_RETURN(Value v, Eval(*e, scope));
      values.push_back(std::move(v));
    }
    return values;
  }

  absl::StatusOr<Value> EvalNode(const expr::List& node, Location, Scope* scope) {
    VC_ASSIGN_OR_RETURN(std::vector<Value> items, EvalAll(node.items, scope));
    return Value::List(std::move(items));
  }

  absl::StatusOr<Value> EvalNode(const expr::Tuple& node, Location, Scope* scope) {
    VC_ASSIGN_OR_RETURN(std::vector<Value> items, EvalAll(node.items, scope));
    return Value::Tuple(std::move(items));
  }

  absl::StatusOr<Value> EvalNode(const expr::Dict& node, Location, Scope* scope) {
    Dict d;
    for (const auto& [key_expr, value_expr] : node.items) {
      VC_ASSIGN_OR_RETURN(Value key, Eval(*key_expr, scope));
      VC_ASSIGN_OR_RETURN(Value value, Eval(*value_expr, scope));
      VC_RETURN_IF_ERROR(CheckHashable(key));
      d.Set(std::move(key), std::move(value));
    }
    return Value::FromDict(std::move(d));
  }

  absl::StatusOr<Value> EvalNode(const expr::GetAttr& node, Location, Scope* scope) {
    VC_ASSIGN_OR_RETURN(const Value object, Eval(*node.object, scope));
    return GetAttribute(object, node.name);
  }

  absl::StatusOr<Value> EvalNode(const expr::GetItem& node, Location, Scope* scope) {
    VC_ASSIGN_OR_RETURN(const Value object, Eval(*node.object, scope));
    VC_ASSIGN_OR_RETURN(const Value key, Eval(*node.key, scope));
    return GetItem(object, key);
  }

  absl::StatusOr<Value> EvalOptional(const ExprPtr& e, Scope* scope) {
    if (e == nullptr) return Value();
    return Eval(*e, scope);
  }

  absl::StatusOr<Value> EvalNode(const expr::Slice& node, Location, Scope* scope) {
    VC_ASSIGN_OR_RETURN(const Value object, Eval(*node.object, scope));
    VC_ASSIGN_OR_RETURN(const Value start, EvalOptional(node.start, scope));
    VC_ASSIGN_OR_RETURN(const Value stop, EvalOptional(node.stop, scope));
    VC_ASSIGN_OR_RETURN(const Value step, EvalOptional(node.step, scope));
    return GetSlice(object, start, stop, step);
  }

  absl::StatusOr<Value> EvalNode(const expr::Call& node, Location, Scope* scope) {
    VC_ASSIGN_OR_RETURN(const Value callee, Eval(*node.callee, scope));
    VC_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(node.args, scope));
    return CallValue(callee, std::move(args));
  }

  absl::StatusOr<Value> EvalNode(const expr::Filter& node, Location, Scope* scope) {
    VC_ASSIGN_OR_RETURN(Value operand, Eval(*node.operand, scope));
    return ApplyFilter(node.call, std::move(operand), scope);
  }

  absl::StatusOr<Value> EvalNode(const expr::Test& node, Location, Scope* scope) {
    VC_ASSIGN_OR_RETURN(const Value operand, Eval(*node.operand, scope));
    VC_ASSIGN_OR_RETURN(const CallArgs args, EvalArgs(node.args, scope));
    VC_ASSIGN_OR_RETURN(const bool passed, node.test->apply(operand, args));
    return Value::Bool(passed != node.negated);
  }

  absl::StatusOr<Value> EvalNode(const expr::Not& node, Location, Scope* scope) {
    VC_ASSIGN_OR_RETURN(const Value v, Eval(*node.operand, scope));
    return Value::Bool(!Truthy(v));
  }

  absl::StatusOr<Value> EvalNode(const expr::Negate& node, Location, Scope* scope) {
    VC_ASSIGN_OR_RETURN(const Value v, Eval(*node.operand, scope));
    return Negate(v);
  }

  absl::StatusOr<Value> EvalNode(const expr::Plus& node, Location, Scope* scope) {
    VC_ASSIGN_OR_RETURN(const Value v, Eval(*node.operand, scope));
    if (v.is_undefined()) return absl::InvalidArgumentError(v.undefined_message());
    if (v.is_float()) return v;
    if (v.is_number()) return Value::Int(v.int_value());
    return TypeError(absl::StrCat("bad operand type for unary +: '", TypeName(v), "'"));
  }

  absl::StatusOr<Value> EvalNode(const expr::Arithmetic& node, Location, Scope* scope) {
    VC_ASSIGN_OR_RETURN(const Value left, Eval(*node.left, scope));
    VC_ASSIGN_OR_RETURN(const Value right, Eval(*node.right, scope));
    return Arithmetic(node.op, left, right);
  }

  absl::StatusOr<Value> EvalNode(const expr::Logical& node, Location, Scope* scope) {
    VC_ASSIGN_OR_RETURN(Value left, Eval(*node.left, scope));
    if (Truthy(left) != node.is_and) return left;  // `and` stops at a false operand, `or` at a true one
    return Eval(*node.right, scope);
  }

  absl::StatusOr<Value> EvalNode(const expr::Concat& node, Location, Scope* scope) {
    std::string text;
    for (const ExprPtr& part : node.parts) {
      VC_ASSIGN_OR_RETURN(const Value v, Eval(*part, scope));
      VC_ASSIGN_OR_RETURN(const std::string s, Str(v));
      text += s;
    }
    return Value::String(std::move(text));
  }

  static absl::StatusOr<bool> Holds(CompareOp op, const Value& a, const Value& b) {
    switch (op) {
      case CompareOp::kEqual:
        return Equal(a, b);
      case CompareOp::kNotEqual:
        return !Equal(a, b);
      case CompareOp::kLess:
        return Compare(Order::kLess, a, b);
      case CompareOp::kLessEqual:
        return Compare(Order::kLessEqual, a, b);
      case CompareOp::kGreater:
        return Compare(Order::kGreater, a, b);
      case CompareOp::kGreaterEqual:
        return Compare(Order::kGreaterEqual, a, b);
      case CompareOp::kIn:
        return Contains(b, a);
      case CompareOp::kNotIn: {
        VC_ASSIGN_OR_RETURN(const bool in, Contains(b, a));
        return !in;
      }
    }
    return false;
  }

  absl::StatusOr<Value> EvalNode(const expr::Compare& node, Location, Scope* scope) {
    VC_ASSIGN_OR_RETURN(Value left, Eval(*node.first, scope));
    for (const auto& [op, operand] : node.rest) {
      VC_ASSIGN_OR_RETURN(Value right, Eval(*operand, scope));
      VC_ASSIGN_OR_RETURN(const bool holds, Holds(op, left, right));
      if (!holds) return Value::Bool(false);
      left = std::move(right);
    }
    return Value::Bool(true);
  }

  absl::StatusOr<Value> EvalNode(const expr::Conditional& node, Location at, Scope* scope) {
    VC_ASSIGN_OR_RETURN(const Value condition, Eval(*node.condition, scope));
    if (Truthy(condition)) return Eval(*node.then, scope);
    if (node.otherwise != nullptr) return Eval(*node.otherwise, scope);
    return Value::Undefined(absl::StrCat("the inline if-expression on line ", at.line,
                                         " evaluated to false and no else section was defined."));
  }

  // ------------------------------------------------------------------------- macros

  absl::StatusOr<Value> InvokeMacro(const stmt::Macro& macro, Scope* defined_in, CallArgs args) {
    Scope* scope = NewScope(defined_in);
    std::vector<std::pair<std::string, Value>> keywords = std::move(args.keyword);
    const auto take_keyword = [&](const std::string& name) -> std::optional<Value> {
      for (auto it = keywords.begin(); it != keywords.end(); ++it) {
        if (it->first == name) {
          Value v = std::move(it->second);
          keywords.erase(it);
          return v;
        }
      }
      return std::nullopt;
    };
    bool has_caller_param = false;
    for (size_t i = 0; i < macro.params.size(); ++i) {
      const Param& p = macro.params[i];
      has_caller_param = has_caller_param || p.name == "caller";
      std::optional<Value> v;
      if (i < args.positional.size()) {
        v = args.positional[i];
      } else {
        v = take_keyword(p.name);
      }
      if (!v.has_value()) {
        if (p.default_value != nullptr) {
          VC_ASSIGN_OR_RETURN(v, Eval(*p.default_value, scope));
        } else {
          v = Value::Undefined(absl::StrCat("parameter ", python::Repr(p.name), " was not provided"));
        }
      }
      scope->Set(p.name, *std::move(v));
    }
    if (macro.takes_caller && !has_caller_param) {
      std::optional<Value> caller = take_keyword("caller");
      scope->Set("caller", caller.has_value() ? *std::move(caller) : Value::Undefined("No caller defined"));
    }
    if (macro.takes_kwargs) {
      Dict d;
      for (auto& [key, value] : keywords) d.Set(Value::String(key), std::move(value));
      scope->Set("kwargs", Value::FromDict(std::move(d)));
    } else if (!keywords.empty()) {
      const std::string& key = keywords.front().first;
      if (key == "caller") {
        return TypeError(absl::StrCat("macro ", python::Repr(macro.name),
                                      " was invoked with two values for the special caller argument. This is most "
                                      "likely a bug."));
      }
      return TypeError(
          absl::StrCat("macro ", python::Repr(macro.name), " takes no keyword argument ", python::Repr(key)));
    }
    if (macro.takes_varargs) {
      std::vector<Value> extra;
      for (size_t i = macro.params.size(); i < args.positional.size(); ++i) extra.push_back(args.positional[i]);
      scope->Set("varargs", Value::Tuple(std::move(extra)));
    } else if (args.positional.size() > macro.params.size()) {
      return TypeError(absl::StrCat("macro ", python::Repr(macro.name), " takes not more than ", macro.params.size(),
                                    " argument(s)"));
    }
    std::string out;
    Flow flow = Flow::kNormal;
    VC_RETURN_IF_ERROR(ExecBody(macro.body, scope, &out, &flow));
    return Value::String(std::move(out));
  }

  std::deque<Scope> scopes_;  // every scope of the rendering; macros keep pointers to theirs
  int call_depth_ = 0;
};

absl::StatusOr<Value> MacroObject::Call(CallArgs args) const {
  return renderer_->CallMacro(macro_, scope_, std::move(args));
}

}  // namespace

absl::StatusOr<std::string> Render(const Body& body, const Dict& context,
                                   const std::vector<std::pair<std::string, Value>>& globals) {
  Renderer renderer;
  Scope* global_scope = renderer.NewScope(nullptr);
  for (const auto& [name, value] : globals) global_scope->Set(name, value);
  Scope* root = renderer.NewScope(global_scope);
  for (const auto& [key, value] : context.items) {
    if (!key.is_string()) return absl::InvalidArgumentError("context keys must be strings");
    root->Set(key.string(), value);
  }
  std::string out;
  Flow flow = Flow::kNormal;
  VC_RETURN_IF_ERROR(renderer.ExecBody(body, root, &out, &flow));
  return out;
}

}  // namespace vc::jinja
