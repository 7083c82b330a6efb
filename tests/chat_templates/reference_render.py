#!/usr/bin/python3
"""Renders chat templates in the Jinja environment of Hugging Face transformers' apply_chat_template.

stdin: a JSON list of cases {"template": str, "context": object, "now": seconds since the epoch (optional;
the time strftime_now formats, in the local time zone; the current time when absent)}.
stdout: a JSON list with, for each case, {"output": str} or {"error": str} (the exception's message).
"""
import datetime
import json
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def make_environment(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers replaces jinja2's tojson, which escapes HTML characters.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        at = datetime.datetime.now() if now is None else datetime.datetime.fromtimestamp(now)
        return at.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(case, compiled):
    try:
        key = (case["template"], case.get("now"))
        if key not in compiled:
            compiled[key] = make_environment(case.get("now")).from_string(case["template"])
        return {"output": compiled[key].render(**case["context"])}
    except Exception as e:  # every failure is an answer to compare
        return {"error": str(e)}


def main():
    cases = json.load(sys.stdin)
    compiled = {}  # a template is compiled once per batch
    json.dump([render(case, compiled) for case in cases], sys.stdout)


if __name__ == "__main__":
    main()
