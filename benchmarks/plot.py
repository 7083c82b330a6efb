#!/usr/bin/env python3
"""Plots the JSON files written by the benchmarks (decode_bench, engine_bench, store_bench) as PNG.

  /usr/bin/python3 benchmarks/plot.py decode  results/decode.json  results/decode.png
  /usr/bin/python3 benchmarks/plot.py engine  results/engine.json  results/engine.png
  /usr/bin/python3 benchmarks/plot.py prefix  results/prefix.json  results/prefix.png
  /usr/bin/python3 benchmarks/plot.py store   results/store.json   results/store.png

Needs Debian's python3-matplotlib (plots only; nothing in the build or tests uses it).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_decode(rows, out):
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for backend in sorted({r["backend"] for r in rows}):
        for batch in sorted({r["batch"] for r in rows}):
            pts = sorted((r["context"], r) for r in rows if r["backend"] == backend and r["batch"] == batch)
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ax[0].plot(xs, [p[1]["tokens_per_s"] for p in pts], marker="o", label=f"{backend} b={batch}")
            ax[1].plot(xs, [p[1]["fraction_of_floor"] for p in pts], marker="o", label=f"{backend} b={batch}")
    for a, t in zip(ax, ["decode tokens/s", "fraction of memory-bandwidth floor"]):
        a.set_xscale("log", base=2)
        a.set_xlabel("context (tokens)")
        a.set_title(t)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_engine(rows, out):
    rows = [r for r in rows if "mode" in r]
    links = sorted({r["link_ratio"] for r in rows if r["mode"] in ("offload", "vericache")})
    fig, axes = plt.subplots(1, max(1, len(links)), figsize=(5 * max(1, len(links)), 4), squeeze=False)
    for ax, link in zip(axes[0], links):
        local = ("full", "lossy", "vericache-resident")
        for mode in ("full", "lossy", "vericache-resident", "offload", "vericache"):
            for batch in sorted({r["batch"] for r in rows}):
                pts = sorted((r["context"], r["tokens_per_s"]) for r in rows
                             if r["mode"] == mode and r["batch"] == batch
                             and (r["link_ratio"] == link or mode in local))
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{mode} b={batch}",
                            linestyle="--" if mode == "lossy" else "-")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("verified tokens/s (lossy: unverified)")
        ax.set_title("link unpaced" if link == 0 else f"link = memory bandwidth / {link}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_store(run, out):
    rows = run["rows"]
    threads = sorted({r["threads"] for r in rows})
    # system -> (colour, line style, label for gets, label for puts)
    styles = {"memcpy": ("tab:gray", ":", "memcpy", None),
              "ucx": ("tab:orange", "--", "raw UCX get", None),
              "store": ("tab:green", "-", "store GetRemote", "store Put"),
              "store-batch": ("tab:red", "-", "store GetRemoteBatch", None),
              "store-stream": ("tab:brown", "-", "store GetRemoteBatchInto, streamed", None),
              "redis": ("tab:purple", "-.", "Redis GET", "Redis SET")}
    fig, axes = plt.subplots(2, len(threads), figsize=(4.5 * len(threads), 7.5), squeeze=False)
    for col, t in enumerate(threads):
        for row, op in enumerate(("get", "put")):
            ax = axes[row][col]
            for system, (colour, style, get_label, put_label) in styles.items():
                pts = sorted((r["block_bytes"], r["gbps"]) for r in rows
                             if r["op"] == op and r["system"] == system and r["threads"] == t)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=colour, linestyle=style,
                            label=get_label if op == "get" else put_label)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("block size (bytes)")
            ax.set_ylabel("GB/s")
            ax.set_title(f"{op}s, {t} client thread{'s' if t > 1 else ''}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"cache store on loopback ({run['hardware_threads']} cores), UCX error mode "
                 f"{run['ucx_error_mode']}, best of {run['runs_per_point']} runs per point", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_prefix(run, out):
    modes = run["modes"]
    names = [m["mode"] for m in modes]
    colors = ["tab:gray", "tab:blue", "tab:green"][:len(names)]
    fig, ax = plt.subplots(1, 3, figsize=(13, 4))
    xs = range(len(names))
    ax[0].bar(xs, [1e3 * m["ttft_mean_s"] for m in modes], color=colors)
    ax[0].errorbar(xs, [1e3 * m["ttft_p50_s"] for m in modes], fmt="o", color="k", label="p50")
    ax[0].errorbar(xs, [1e3 * m["ttft_p90_s"] for m in modes], fmt="^", color="k", label="p90")
    ax[0].set_yscale("log")
    ax[0].set_title("time to first token (ms, log; bar: mean)")
    ax[0].legend(fontsize=7)
    ax[1].bar(xs, [m["tokens_per_s"] for m in modes], color=colors)
    ax[1].set_title("throughput (generated tokens / makespan)")
    for i, m in enumerate(modes):
        reqs = sorted(m["requests"], key=lambda r: r["arrival_s"])
        ax[2].scatter([r["prompt_tokens"] for r in reqs], [1e3 * r["ttft_s"] for r in reqs], color=colors[i],
                      label=m["mode"], s=14)
    ax[2].set_xlabel("prompt tokens")
    ax[2].set_ylabel("TTFT (ms)")
    ax[2].set_yscale("log")
    ax[2].set_title("TTFT per request")
    ax[2].legend(fontsize=7)
    for a in ax[:2]:
        a.set_xticks(list(xs))
        a.set_xticklabels(names)
    for a in ax:
        a.grid(alpha=0.3)
    fig.suptitle(f"{run['requests']} requests of the conversation trace, {run['block_tokens']} tokens per trace "
                 f"block, arrivals / {run['time_scale']:g}; full KV budget {run['full_kv_bytes'] / 2**20:.0f} MiB; link "
                 + (f"{run['link_bytes_per_second'] / 1e6:.0f} MB/s" if run.get('link_bytes_per_second') else "loopback UCX"),
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    kind, src, out = sys.argv[1:4]
    with open(src) as f:
        rows = json.load(f)
    {"decode": plot_decode, "engine": plot_engine, "store": plot_store, "prefix": plot_prefix}[kind](rows, out)


if __name__ == "__main__":
    main()
