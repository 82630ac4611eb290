"""`mtpkit bench` output: the terminal table, bench.json, bench.md and bench.png (matplotlib, when installed)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TextIO

from . import peer_timing


def _cell(pred: float | None, meas: float | None) -> str:
    return "-" if pred is None or meas is None else f"{pred:.2f}/{meas:.2f}"


def _chosen(ks: list[int]) -> str:
    return ",".join(str(k) for k in ks)


def table_rows(report: dict) -> list[list[str]]:
    """Header plus one row per category and "all": predicted/measured speed-up per k, auto, chosen k."""
    max_draft = report["config"]["max_draft"]
    rows = [["category", "prompts", *(f"k={k}" for k in range(1, max_draft + 1)), "auto", "chosen k"]]
    for name, c in report["categories"].items():
        auto = f"{c['speedup']:.2f}x" if c["speedup"] else "-"
        rows.append([name, str(c["prompts"]), *(_cell(p, m) for p, m in zip(c["predicted"], c["measured"])), auto,
                     _chosen(c["chosen_k"])])
    return rows


def print_bench(report: dict, repeats: int) -> None:
    rows = table_rows(report)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print("speed-up over plain decoding, predicted/measured (median over prompts); auto: the default schedule, "
          "measured; chosen k: the cost model's pick per prompt (0 = plain)")
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    threads = report.get("threads")
    threads = f", threads {peer_timing.format_threads(threads)}" if threads else ""
    print(f"median speedup {report['median_speedup']:.2f}x ({report['backend']}{threads}, auto vs plain on the same "
          f"graphs, {repeats} interleaved repeats)")
    if report.get("peers"):
        peer_timing.print_peers(report["peers"])


def to_markdown(report: dict) -> str:
    """Category table, then one row per prompt with plain ms/token, predicted/measured per k and auto."""
    rows = table_rows(report)
    lines = ["# mtpkit bench", "", f"backend {report['backend']}, threads {report.get('threads')}, config "
             f"`{json.dumps(report['config'])}`", "",
             "Speed-up over plain decoding, predicted/measured (medians over prompts).", "", _md(rows), "",
             "## Per prompt", ""]
    max_draft = report["config"]["max_draft"]
    per = [["prompt", "category", "plain ms/tok", *(f"k={k}" for k in range(1, max_draft + 1)), "auto", "auto mean k",
            "chosen k"]]
    for r in report["rows"]:
        per.append([r["prompt"], r["category"], f"{r['plain_ms_per_token']:.3f}",
                    *(_cell(x["predicted_speedup"], x["measured_speedup"]) for x in r["ks"]),
                    f"{r['speedup']:.2f}x", f"{r['spec_mean_k']:.2f}", str(r["chosen_k"])])
    return "\n".join(lines + [_md(per), ""] + (peer_timing.to_markdown(report["peers"]) if report.get("peers") else []))


def _md(rows: list[list[str]]) -> str:
    head, *body = rows
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in body])


def write_report(report: dict, out: Path) -> list[str]:
    """bench.json, bench.md and bench.png in `out`; returns notes for the user (e.g. a PNG skipped)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "bench.md").write_text(to_markdown(report))
    try:
        import matplotlib
    except ImportError:
        return [f"{out / 'bench.png'} skipped: matplotlib is not installed (pip install matplotlib)"]
    matplotlib.use("Agg")  # files only, never a window
    plot(report, out / "bench.png")
    return []


def plot(report: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    ks = list(range(1, report["config"]["max_draft"] + 1))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (name, c) in enumerate(report["categories"].items()):
        color = f"C{i}"
        left.plot(ks, c["measured"], "o-", color=color, label=f"{name} measured")
        left.plot(ks, c["predicted"], "--", color=color, label=f"{name} predicted")
        right.plot(ks, [a if a is not None else float("nan") for a in c["acceptance"]], "o-", color=color, label=name)
    left.axhline(1.0, color="grey", lw=0.8)
    left.set(xlabel="draft length k", ylabel="speed-up over plain decoding", title="speed-up vs k")
    right.set(xlabel="draft position i", ylabel="acceptance of draft i given 1..i-1", title="acceptance by draft position",
              ylim=(0, 1.05))
    left.legend(fontsize=7, ncol=2)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


class Progress:
    """One stderr line rewritten in place; silent when quiet or when stderr is not a terminal."""

    def __init__(self, quiet: bool, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.on = not quiet and self.stream.isatty()
        self.start, self.width = time.perf_counter(), 0

    def __call__(self, what: str) -> None:
        if self.on:
            line = f"bench {time.perf_counter() - self.start:5.0f}s {what}"
            self.stream.write("\r" + line.ljust(self.width))
            self.stream.flush()
            self.width = len(line)

    def close(self) -> None:
        if self.on and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
