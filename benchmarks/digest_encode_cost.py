"""What a GPU window's digest reply costs the guard's walls, per call, by the digests' values.

Both walls of an outside-clock window include the worker's reply: its digests (``DIGEST_WIDTH``
floats a call and output) encoded by ``protocol.send`` and decoded and validated by the guard
(``m.ConfirmReply``). The trusted loop digests buffers it never writes; the candidate's, real
outputs. This times that round trip on this machine's CPU for digests of real-looking values,
of zeros and of values rounded to a few digits (what a candidate could send within a digest's
tolerance), so the gap between the two walls can be read off. No GPU is used.

    python -m benchmarks.digest_encode_cost [--calls 400] [--reps 30]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from guard.runner import messages as m
from guard.runner import protocol


def per_call_us(work: Callable[[], object], calls: int, reps: int) -> float:
    """The least of ``reps`` timings of ``work``, per call, in microseconds."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - t0)
    return best / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    rng = random.Random(0)
    kinds: dict[str, Callable[[], float]] = {
        "real-looking": lambda: rng.uniform(-500.0, 500.0),
        "zeros": lambda: 0.0,
        "rounded (3 digits)": lambda: round(rng.uniform(-500.0, 500.0), 3),
    }
    print(f"{args.calls} calls, one output, {m.DIGEST_WIDTH} floats a call; least of {args.reps} runs")
    for name, value in kinds.items():
        reply = {"ok": True, "digests": [[[value() for _ in range(m.DIGEST_WIDTH)]] for _ in range(args.calls)]}
        data = protocol._dumps(reply, allow_nan=True)
        encode = per_call_us(lambda r=reply: protocol._dumps(r, allow_nan=True), args.calls, args.reps)
        decode = per_call_us(lambda d=data: m.ConfirmReply.model_validate(protocol._loads(d)), args.calls, args.reps)
        print(
            f"{name:20s} encode {encode:6.1f} us  decode+validate {decode:6.1f} us  "
            f"total {encode + decode:6.1f} us a call  ({len(data) / args.calls:.0f} bytes)"
        )


if __name__ == "__main__":
    main()
