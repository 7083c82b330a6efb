// The reference's side of benchmarks/tokenizer_bench: encodes FILE with tokenizer NAME, 200 lines
// at a time (the C++ side cuts it the same way), and prints one JSON line: the best of PASSES
// passes in MB/s, the number of ids and a checksum of them, so both sides can be seen to agree.
//
//   node bench.mjs NAME FILE [PASSES]
import { readFileSync } from "node:fs";
import { loadReference } from "./make_fixtures.mjs";

const [name, file, passesArg] = process.argv.slice(2);
const passes = Number(passesArg ?? 2);
const bytes = readFileSync(file);
const lines = bytes.toString("utf8").split("\n");
const chunks = [];
for (let i = 0; i < lines.length; i += 200) {
  chunks.push(lines.slice(i, i + 200).join("\n") + (i + 200 < lines.length ? "\n" : ""));
}
const t0 = performance.now();
const tokenizer = await loadReference(name);
const loadSeconds = (performance.now() - t0) / 1e3;
let best = Infinity, count = 0, checksum = 0;
for (let p = 0; p < passes; ++p) {
  const start = performance.now();
  count = 0;
  checksum = 0;
  for (const c of chunks) {
    const ids = tokenizer.encode(c, { add_special_tokens: false });
    count += ids.length;
    for (const id of ids) checksum = (Math.imul(checksum, 31) + id) >>> 0;
  }
  best = Math.min(best, (performance.now() - start) / 1e3);
}
console.log(JSON.stringify({ mb_per_s: bytes.length / 1e6 / best, seconds: best, ids: count, checksum, load_seconds: loadSeconds }));
