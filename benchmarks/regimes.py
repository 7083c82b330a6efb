#!/usr/bin/python3
"""The regime benchmark: VeriCache against the best baseline a user would run instead, in each regime.

  /usr/bin/python3 benchmarks/regimes.py [--rounds 5] [--only resident,offload,budget,prefix,demo]
                                         [--contexts 4096,16384,32000] [--batches 1,8] [--tokens 64]
                                         [--out benchmarks/results/regimes]

Regimes and their baselines (each ratio is VeriCache's verified tokens/s over the best baseline's,
measured side by side in one process; a row gives the median and the spread of the rounds):

  resident  full KV in worker memory (engine_bench full,resident; the rounds alternate inside one
            process): baseline (a), resident full-KV decoding.
  offload   full KV in the host tier, fetched unpaced and over a link paced at 1/60 and 1/250 of
            memcpy (engine_bench offload,vericache): baseline (b), fetching it every step. A
            resident decoder does not fit this regime by definition.
  budget    a fixed 256 MiB of KV memory at 16K (engine_bench --budget-mib): baseline, full-KV
            decoding of the sequences whose full KV fits.
  prefix    the remote-prefix replay (prefix_bench) on loopback and on a 183 MB/s link: baselines,
            recomputing the prefix and fetching it before decoding; throughput and time to first
            token.
  demo      vericache demo: fetch-then-decode against VeriCache on the demo's requests.

Every VeriCache output in these runs is checked token for token against full-KV decoding by the
benchmarks themselves (they exit non-zero otherwise). Writes OUT.json, OUT.md and, with
python3-matplotlib, OUT.png.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

BUILD = os.environ.get("VC_BUILD", "build")
MODEL = "models/vc-code-4m"


def run(cmd):
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out.stdout


def engine_json(args):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        run([f"{BUILD}/benchmarks/engine_bench", "--model", MODEL, "--json", f.name] + args)
        with open(f.name) as g:
            return json.load(g)


def prefix_json(args):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        run([f"{BUILD}/benchmarks/prefix_bench", "--model", MODEL, "--json", f.name] + args)
        with open(f.name) as g:
            return json.load(g)


def summary(name, baseline, ratios, note=""):
    return {"regime": name, "baseline": baseline, "rounds": len(ratios), "ratios": ratios,
            "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "note": note}


def resident(a, rows):
    for ctx in a.contexts:
        for batch in a.batches:
            j = engine_json(["--contexts", str(ctx), "--batches", str(batch), "--tokens", str(a.tokens),
                             "--modes", "full,resident", "--link-ratios", "0", "--rounds", str(a.rounds)])
            r = next(x for x in j if x.get("mode") == "vericache-resident")
            ratios = r["extra"]["rounds_vs_full"]
            ratios = ratios if isinstance(ratios, list) else [ratios]
            rows.append(summary(f"resident {ctx // 1024}K, batch {batch}", "(a) resident full-KV decoding", ratios,
                                f"{r['extra'].get('tokens_per_verify', 0):.2f} tokens per verify"))


def offload(a, rows):
    per = {}
    for _ in range(a.rounds):
        j = engine_json(["--contexts", "16384", "--batches", "1", "--tokens", str(a.tokens),
                         "--modes", "offload,vericache", "--link-ratios", "0,60,250"])
        for link in (0, 60, 250):
            b = next(x for x in j if x.get("mode") == "offload" and x.get("link_ratio") == link)
            v = next(x for x in j if x.get("mode") == "vericache" and x.get("link_ratio") == link)
            per.setdefault(link, []).append(v["tokens_per_s"] / b["tokens_per_s"])
    for link, ratios in per.items():
        rows.append(summary(f"offloaded 16K, {'unpaced' if link == 0 else f'1/{link}'}",
                            "(b) fetch the full KV every step", ratios))


def budget(a, rows):
    ratios = []
    for _ in range(a.rounds):
        j = engine_json(["--contexts", "16384", "--batches", "1", "--tokens", str(a.tokens), "--modes", "full",
                         "--link-ratios", "0", "--budget-mib", "256"])
        b = next(x for x in j if "budget_mib" in x)
        ratios.append(b["vericache_tokens_per_s"] / b["full_tokens_per_s"])
    rows.append(summary("256 MiB of KV at 16K", "full-KV decoding of the sequences that fit", ratios,
                        f"batch {b['full_batch']} full against {b['vericache_batch']} VeriCache"))


def prefix(a, rows):
    for link in (0, 183):
        tput, ttft = [], []
        for _ in range(a.rounds):
            j = prefix_json(["--link-mb-per-s", str(link)])
            m = {r["mode"]: r for r in j["modes"]}
            best = max((m[k] for k in m if k != "vericache"), key=lambda r: r["tokens_per_s"])
            tput.append(m["vericache"]["tokens_per_s"] / best["tokens_per_s"])
            best_ttft = min(m[k]["ttft_mean_s"] for k in m if k != "vericache")
            ttft.append(best_ttft / m["vericache"]["ttft_mean_s"])
        name = "loopback" if link == 0 else f"{link} MB/s"
        rows.append(summary(f"remote prefix, {name}: throughput", "the faster of recompute and fetch-then-decode",
                            tput))
        rows.append(summary(f"remote prefix, {name}: time to first token (inverse)",
                            "the sooner of recompute and fetch-then-decode", ttft))


def demo(a, rows):
    tput, ttft = [], []
    for _ in range(a.rounds):
        out = run([f"{BUILD}/services/vericache", "demo"])
        got = {}
        for line in out.splitlines():
            m = re.match(r"(fetch the full prefix|VeriCache: draft).*?\s+([\d.]+)\s+(\d+)\s+\d+/\d+$", line)
            if m:
                got[m.group(1)] = (float(m.group(2)), float(m.group(3)))
        f, v = got["fetch the full prefix"], got["VeriCache: draft"]
        tput.append(v[1] / f[1])
        ttft.append(f[0] / v[0])
    rows.append(summary("the demo: throughput", "fetch the full prefix, then decode", tput))
    rows.append(summary("the demo: time to first token (inverse)", "fetch the full prefix, then decode", ttft))


def write(rows, out):
    with open(out + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write("| regime | baseline | rounds | VeriCache / baseline, median | spread |\n|---|---|---:|---:|---|\n")
        for r in rows:
            note = f" ({r['note']})" if r["note"] else ""
            f.write(f"| {r['regime']}{note} | {r['baseline']} | {r['rounds']} | {r['median']:.2f}x | "
                    f"{r['min']:.2f}-{r['max']:.2f} |\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no python3-matplotlib: no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
    ys = range(len(rows))
    med = [r["median"] for r in rows]
    err = [[r["median"] - r["min"] for r in rows], [r["max"] - r["median"] for r in rows]]
    ax.barh(list(ys), med, xerr=err, color=["tab:green" if m >= 0.97 else "tab:red" for m in med])
    ax.axvline(1.0, color="black", lw=0.8)
    ax.axvline(0.97, color="gray", lw=0.8, ls="--")
    ax.set_yticks(list(ys))
    ax.set_yticklabels([r["regime"] for r in rows], fontsize=8)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("VeriCache / best baseline (median, spread of rounds; dashed: 0.97)")
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", default="resident,offload,budget,prefix,demo")
    p.add_argument("--contexts", default="4096,16384,32000")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--out", default="benchmarks/results/regimes")
    a = p.parse_args()
    a.contexts = [int(x) for x in a.contexts.split(",")]
    a.batches = [int(x) for x in a.batches.split(",")]
    rows = []
    for name in a.only.split(","):
        {"resident": resident, "offload": offload, "budget": budget, "prefix": prefix, "demo": demo}[name](a, rows)
        write(rows, a.out)  # what is done so far survives a later failure
    print(open(a.out + ".md").read())


if __name__ == "__main__":
    main()
