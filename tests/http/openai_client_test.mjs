// The official openai client against a real worker and a real router (run by http_api_test, which
// starts them and writes the cases with the outputs gRPC and sequential full-KV decoding gave).
//
// Env: VC_TARGETS (a JSON list of base URLs), VC_TOKEN, VC_MODEL, VC_CASES (a JSON file of
// {name, kind: "completion"|"chat", body, text}). Every case runs on every target, plain and
// streamed; then bad requests and cancellation. Prints one JSON line of counts; exits 1 on any
// mismatch.
import fs from "node:fs";
import OpenAI from "openai";

const targets = JSON.parse(process.env.VC_TARGETS);
const cases = JSON.parse(fs.readFileSync(process.env.VC_CASES, "utf8"));
const model = process.env.VC_MODEL;
let failures = 0, checks = 0, cancelled = 0;

function check(ok, what) {
  checks++;
  if (!ok) {
    failures++;
    console.error(`FAIL: ${what}`);
  }
}

async function expectError(promise, status, what) {
  try {
    await promise;
    check(false, `${what}: no error, expected HTTP ${status}`);
  } catch (e) {
    check(e instanceof OpenAI.APIError && e.status === status,
          `${what}: expected HTTP ${status}, got ${e.status} ${e.message}`);
    check(typeof e.error?.message === "string" && e.error.message.length > 0, `${what}: error without a message`);
  }
}

for (const baseURL of targets) {
  const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: process.env.VC_TOKEN, maxRetries: 0 });
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === model, `${baseURL} models: ${JSON.stringify(models.data)}`);
  check((await client.models.retrieve(model)).id === model, `${baseURL} models.retrieve`);

  for (const c of cases) {
    const where = `${baseURL} ${c.name}`;
    const body = { model, ...c.body };
    if (c.kind === "completion") {
      const r = await client.completions.create(body);
      check(r.choices[0].text === c.text, `${where} plain: ${JSON.stringify(r.choices[0].text)} != ${JSON.stringify(c.text)}`);
      check(r.usage.prompt_tokens === c.prompt_tokens, `${where} plain prompt_tokens ${r.usage.prompt_tokens}`);
      check(r.usage.completion_tokens === c.completion_tokens, `${where} plain completion_tokens ${r.usage.completion_tokens}`);
      check(r.choices[0].finish_reason === c.finish_reason, `${where} plain finish_reason ${r.choices[0].finish_reason}`);
      const stream = await client.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
      let text = "", usage = null, finish = null;
      for await (const chunk of stream) {
        if (chunk.choices.length > 0) {
          text += chunk.choices[0].text;
          finish = chunk.choices[0].finish_reason ?? finish;
        }
        if (chunk.usage) usage = chunk.usage;
      }
      check(text === c.text, `${where} streamed: ${JSON.stringify(text)} != ${JSON.stringify(c.text)}`);
      check(usage?.completion_tokens === c.completion_tokens, `${where} streamed usage ${JSON.stringify(usage)}`);
      check(finish === c.finish_reason, `${where} streamed finish_reason ${finish}`);
    } else {
      const r = await client.chat.completions.create(body);
      check(r.choices[0].message.role === "assistant", `${where} plain role`);
      check(r.choices[0].message.content === c.text,
            `${where} plain: ${JSON.stringify(r.choices[0].message.content)} != ${JSON.stringify(c.text)}`);
      check(r.usage.prompt_tokens === c.prompt_tokens, `${where} plain prompt_tokens ${r.usage.prompt_tokens}`);
      check(r.choices[0].finish_reason === c.finish_reason, `${where} plain finish_reason ${r.choices[0].finish_reason}`);
      const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
      let text = "", usage = null, role = null;
      for await (const chunk of stream) {
        if (chunk.choices.length > 0) {
          role = chunk.choices[0].delta.role ?? role;
          text += chunk.choices[0].delta.content ?? "";
        }
        if (chunk.usage) usage = chunk.usage;
      }
      check(role === "assistant", `${where} streamed role`);
      check(text === c.text, `${where} streamed: ${JSON.stringify(text)} != ${JSON.stringify(c.text)}`);
      check(usage?.prompt_tokens === c.prompt_tokens, `${where} streamed usage ${JSON.stringify(usage)}`);
    }
  }

  // Bad requests: each an APIError with the right status and a message.
  const one = [{ role: "user", content: "hi" }];
  await expectError(client.chat.completions.create({ model: "no-such-model", messages: one }), 404, `${baseURL} unknown model`);
  await expectError(client.chat.completions.create({ model, messages: one, n: 2 }), 400, `${baseURL} n=2`);
  await expectError(client.chat.completions.create({ model, messages: [] }), 400, `${baseURL} no messages`);
  await expectError(client.completions.create({ model, prompt: "x", max_tokens: -1 }), 400, `${baseURL} max_tokens -1`);
  await expectError(client.completions.create({ model, prompt: "x", temperature: "hot" }), 400, `${baseURL} temperature`);
  await expectError(client.completions.create({ model, prompt: "x", max_tokens: 1 << 29 }), 400, `${baseURL} beyond the context`);
  const stranger = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: "wrong-token", maxRetries: 0 });
  await expectError(stranger.completions.create({ model, prompt: "x" }), 401, `${baseURL} wrong token`);

  // Cancellation: a long stream aborted after its first chunk; the worker's counts show it ended.
  const stream = await client.completions.create({
    model, prompt: "def main():", max_tokens: 900, ignore_eos: true, temperature: 0, stream: true });
  let chunks = 0;
  try {
    for await (const chunk of stream) {
      if (++chunks === 1) stream.controller.abort();
    }
  } catch (e) {
    check(e instanceof OpenAI.APIUserAbortError || e.name === "AbortError", `${baseURL} abort: ${e}`);
  }
  check(chunks >= 1, `${baseURL} cancelled stream gave no chunk`);
  cancelled++;
}

console.log(JSON.stringify({ checks, failures, cancelled }));
process.exit(failures === 0 ? 0 : 1);
