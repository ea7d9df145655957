"""Timing variants against each other in one run: each round calls every variant in turn, so a
machine that slows down or speeds up during the run weighs on all of them alike."""
import statistics
import time


def median_us_per_call(variants, *, rounds=7, calls=3000):
    """{name: median over ``rounds`` of the microseconds per call of ``variants[name]()``}."""
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            started = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - started) / calls * 1e6)
    return {name: statistics.median(values) for name, values in times.items()}
