"""What the body gate's lone-surrogate check costs a request (issue #45 finding 4, review of #46).

Every request body is scanned once before any route sees it (gateway/identity/bodylimit.py,
gateway/kit/unicode.py::lone_surrogate_field): a bytes regex looks for a JSON escape in the
surrogate range, and only a body holding one is parsed to find the field. This measures the
scan against the reference the route pays anyway, ``json.loads`` of the same body, in the same
process and run, for a typical submission, a large one, and one that must be parsed.

    python bench/bench_unicode_gate.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import machine, write_section
from gateway.kit.unicode import lone_surrogate_field

SUBMISSION = {"name": "train-llm", "account": "team-a", "workers": 4, "gpus_per_worker": 8,
              "command": ["torchrun", "--nproc-per-node=8", "train.py", "--config", "configs/7b.yaml"],
              "env": {"WANDB_PROJECT": "llm", "NCCL_DEBUG": "WARN", "HF_HOME": "/data/hf"},
              "time_limit": "12h", "pool": "auto", "image": "registry.example/llm:2026.12"}


def bodies() -> dict[str, bytes]:
    large = {**SUBMISSION, "env": {f"VAR_{i}": "x" * 200 for i in range(2000)}}  # ~450 KB
    surrogate = {**SUBMISSION, "env": {**SUBMISSION["env"], "NOTE": "\ud83d\ude00 ok"}}  # a pair: valid
    return {
        "a submission (%d B)": json.dumps(SUBMISSION).encode(),
        "a large body (%d B)": json.dumps(large).encode(),
        "a body with an escaped pair, parsed to look (%d B)": json.dumps(surrogate).encode(),
    }


def per_call_us(fn, arg, *, min_s: float = 0.2) -> float:
    n, spent = 0, 0.0
    start = time.perf_counter()
    while spent < min_s:
        for _ in range(100):
            fn(arg)
        n += 100
        spent = time.perf_counter() - start
    return spent / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    rows = []
    for label, body in bodies().items():
        assert lone_surrogate_field(body) is None  # none of them is refused
        gate, parse = [], []
        for _ in range(args.repeats):  # in turns, so drift of the host hits both
            gate.append(per_call_us(lone_surrogate_field, body))
            parse.append(per_call_us(json.loads, body))
        g, p = median(gate), median(parse)
        rows.append(f"| {label % len(body)} | {g:.2f} | {p:.2f} | {g / p:.3f} |")
        print(rows[-1], flush=True)
    write_section("unicode-gate", "\n".join([
        "## The body gate's lone-surrogate check (`bench/bench_unicode_gate.py`)",
        "",
        (f"`python bench/bench_unicode_gate.py --repeats {args.repeats}` ({machine()}; "
        f"run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). Median microseconds per call over "
        f"{args.repeats} alternating repeats, in one process; the reference is `json.loads` of the same "
        "body, which the route pays anyway."),
        "",
        "| body | check (µs) | json.loads (µs) | check / json.loads |",
        "|---|---|---|---|",
        *rows,
        "",
        ("A body without an escape in the surrogate range costs one regex scan of its bytes; only one "
        "with such an escape (a valid pair too) is parsed a second time to find the field."),
    ]))


if __name__ == "__main__":
    main()
