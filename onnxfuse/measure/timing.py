"""The timing loop: callables interleaved in short blocks after a warm-up, repeated until the median is
stable or the budget runs out, and the statistics of their samples."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class TimingPolicy:
    """How long and how often to run. A group runs each model ``min_reps`` times at least, then stops once every
    median is stable (the two halves of its runs agree within ``rel_tol``) or the budget is spent; tests shrink
    the budget."""

    warmup_runs: int = 2  # at least this many untimed runs of each model ...
    warmup_s: float = 0.25  # ... and at least this long, so GPU clocks have ramped up before we time
    min_reps: int = 30
    max_reps: int = 100_000
    budget_s: float = 3.0  # per group of interleaved models, warm-up excluded
    rel_tol: float = 0.01  # the two halves' medians must agree this closely
    block_s: float = 0.05  # each model runs this long before the next one takes its turn


@dataclass(frozen=True)
class Timing:
    """Statistics of one model at one batch size, in milliseconds."""

    median_ms: float
    p90_ms: float
    mean_ms: float
    min_ms: float
    reps: int
    stable: bool  # False: the time budget ran out before the median settled
    items: int  # items (batch rows) per run, for throughput

    @property
    def throughput(self) -> float:
        """Items per second at the median latency."""
        return self.items / (self.median_ms / 1e3)

    def to_dict(self) -> dict:
        return {**asdict(self), "throughput_per_s": self.throughput}


def measure(runs: Sequence[Callable[[], object]], policy: TimingPolicy, items: int = 1) -> list[Timing]:
    """Time each callable after a warm-up; one ``Timing`` per callable.

    The callables take turns in short blocks (about ``policy.block_s`` each) rather than single runs:
    after a run, ORT's CPU thread pool keeps spinning for a moment, and strict alternation would make
    each session pay for the other's spinning. The first run of a block is not timed when the block
    has room for it."""
    clock = time.perf_counter
    warm_end = clock() + policy.warmup_s
    warm: list[list[float]] = [[] for _ in runs]
    while len(warm[0]) < policy.warmup_runs or clock() < warm_end:
        for run, out in zip(runs, warm):
            start = clock()
            run()
            out.append(clock() - start)
    # the median warm-up run (the last ones, once warm) sizes each block; one slow outlier must not
    block = [max(1, min(1000, int(policy.block_s / max(statistics.median(w[len(w) // 2 :]), 1e-7)))) for w in warm]

    samples: list[list[float]] = [[] for _ in runs]
    deadline = clock() + policy.budget_s
    while True:
        for run, out, reps in zip(runs, samples, block):
            if reps >= 4:
                run()  # re-warm after the other callable's block
            for _ in range(reps):
                start = clock()
                run()
                out.append(clock() - start)
        n = min(len(s) for s in samples)
        out_of_time = clock() > deadline or n >= policy.max_reps
        if n >= policy.min_reps or out_of_time:
            stable = [_halves_agree(s, policy.rel_tol) for s in samples]
            if all(stable) or out_of_time:
                break
    return [_summarise(s, ok, items) for s, ok in zip(samples, stable)]


def _halves_agree(samples: list[float], rel_tol: float) -> bool:
    half = len(samples) // 2
    if half < 2:
        return False
    first, second = statistics.median(samples[:half]), statistics.median(samples[half:])
    return abs(first - second) <= rel_tol * statistics.median(samples)


def _summarise(samples: list[float], stable: bool, items: int) -> Timing:
    ms = np.asarray(samples) * 1e3
    return Timing(
        median_ms=float(np.median(ms)),
        p90_ms=float(np.percentile(ms, 90)),
        mean_ms=float(ms.mean()),
        min_ms=float(ms.min()),
        reps=len(samples),
        stable=stable,
        items=items,
    )
