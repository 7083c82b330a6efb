// The tree of a parsed Jinja template: expressions and statements, each with where it starts.
// Immutable once parsed.
#ifndef VC_WORKER_CHAT_JINJA_AST_H_
#define VC_WORKER_CHAT_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "worker/chat/jinja_value.h"

namespace vc::jinja {

struct FilterDef;
struct TestDef;

struct Location {
  int line = 1;
  int column = 1;  // in code points, from 1
};

struct Expr;
using ExprPtr = std::unique_ptr<const Expr>;

struct ArgExprs {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

// One `|name(args)` of a filter chain.
struct FilterCall {
  const FilterDef* filter;
  ArgExprs args;
  Location at;
};

enum class CompareOp { kEqual, kNotEqual, kLess, kLessEqual, kGreater, kGreaterEqual, kIn, kNotIn };

namespace expr {
struct Literal {
  Value value;
};
struct Name {
  std::string name;
};
struct List {
  std::vector<ExprPtr> items;
};
struct Tuple {
  std::vector<ExprPtr> items;
};
struct Dict {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};
struct GetAttr {  // object.name
  ExprPtr object;
  std::string name;
};
struct GetItem {  // object[key]
  ExprPtr object;
  ExprPtr key;
};
struct Slice {  // object[start:stop:step]; an absent part is null
  ExprPtr object, start, stop, step;
};
struct Call {
  ExprPtr callee;
  ArgExprs args;
};
struct Filter {
  ExprPtr operand;
  FilterCall call;
};
struct Test {  // operand is [not] name(args)
  ExprPtr operand;
  const TestDef* test;
  ArgExprs args;
  bool negated;
};
struct Not {
  ExprPtr operand;
};
struct Negate {
  ExprPtr operand;
};
struct Plus {  // unary +
  ExprPtr operand;
};
struct Arithmetic {
  ArithmeticOp op;
  ExprPtr left, right;
};
struct Logical {  // and / or: Python's, giving an operand
  bool is_and;
  ExprPtr left, right;
};
struct Concat {  // a ~ b ~ c
  std::vector<ExprPtr> parts;
};
struct Compare {  // first op1 x1 op2 x2 ...: a chain, as Python's
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
};
struct Conditional {  // then if condition else otherwise; otherwise null gives Undefined
  ExprPtr condition, then, otherwise;
};
}  // namespace expr

struct Expr {
  std::variant<expr::Literal, expr::Name, expr::List, expr::Tuple, expr::Dict, expr::GetAttr, expr::GetItem,
               expr::Slice, expr::Call, expr::Filter, expr::Test, expr::Not, expr::Negate, expr::Plus, expr::Arithmetic,
               expr::Logical, expr::Concat, expr::Compare, expr::Conditional>
      node;
  Location at;
};

struct Stmt;
using Body = std::vector<Stmt>;

// What a for loop or a set binds: one name, names to unpack a sequence into, or (set only) the
// attribute of a namespace, names[0].attribute.
struct Target {
  std::vector<std::string> names;
  bool unpack = false;
  std::string attribute;
};

struct Param {
  std::string name;
  ExprPtr default_value;  // null when the caller must give it
};

namespace stmt {
struct Text {
  std::string text;
};
struct Output {
  ExprPtr value;
};
struct If {
  std::vector<std::pair<ExprPtr, Body>> branches;  // if and elifs
  Body otherwise;
};
struct For {
  Target target;
  ExprPtr iterable;
  ExprPtr condition;  // the inline `if`, or null
  Body body;
  Body otherwise;  // runs when no item passed
};
struct Set {
  Target target;
  ExprPtr value;
};
struct SetBlock {  // set target | filters %}body{% endset
  Target target;
  std::vector<FilterCall> filters;
  Body body;
};
struct Macro {
  std::string name;
  std::vector<Param> params;
  Body body;
  // Whether the body reads `caller`, `varargs` or `kwargs` (which the call then fills).
  bool takes_caller = false, takes_varargs = false, takes_kwargs = false;
};
struct CallBlock {  // call(params) callee(args) %}body{% endcall: body is the callee's `caller`
  Macro caller;
  ExprPtr call;  // an expr::Call
};
struct FilterBlock {
  std::vector<FilterCall> filters;
  Body body;
};
struct With {
  std::vector<std::pair<Target, ExprPtr>> assignments;
  Body body;
};
struct Break {};
struct Continue {};
}  // namespace stmt

struct Stmt {
  std::variant<stmt::Text, stmt::Output, stmt::If, stmt::For, stmt::Set, stmt::SetBlock, stmt::Macro, stmt::CallBlock,
               stmt::FilterBlock, stmt::With, stmt::Break, stmt::Continue>
      node;
  Location at;
};

}  // namespace vc::jinja

#endif  // VC_WORKER_CHAT_JINJA_AST_H_
