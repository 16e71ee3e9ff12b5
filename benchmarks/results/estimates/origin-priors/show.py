"""Acceptance rates from ``rates.py``'s counts: per origin, match bucket and rank; per agreement and depth.

    python benchmarks/results/estimates/origin-priors/show.py none-flat.npz
"""

import sys

import numpy as np

from lookahead.draft import ORIGINS


def rate(tried: np.ndarray, accepted: np.ndarray) -> str:
    t, a = tried.sum(), accepted.sum()
    return f"{a / t:.2f}({int(t)})" if t else "-"


def main() -> None:
    data = np.load(sys.argv[1])
    tried, accepted = data["tried"], data["accepted"]
    print("per origin and match bucket, by rank (all depths and agreements): rate (tried)")
    for o in range(tried.shape[0]):
        if tried[o].sum() >= 30:
            for m in range(3):
                cells = [rate(tried[o, :, m, :, r], accepted[o, :, m, :, r]) for r in range(4)]
                print(f"{ORIGINS[o]:8s} match {m + 1}: " + " ".join(f"r{r}:{c}" for r, c in enumerate(cells)))
    print("all origins, by agreement (3: 3 or more) and depth, rank 0 / ranks 1+")
    for g in range(4):
        for ranks, label in ((slice(0, 1), "0"), (slice(1, 4), "1+")):
            cells = [rate(tried[:, g, :, d, ranks], accepted[:, g, :, d, ranks]) for d in range(8)]
            print(f"agree{g} rank{label}: " + " ".join(f"d{d + 1}:{c}" for d, c in enumerate(cells)))
    print("by agreement and match bucket (all origins, ranks and depths)")
    for g in range(4):
        print(f"agree{g}: " + " ".join(f"m{m + 1}:{rate(tried[:, g, m], accepted[:, g, m])}" for m in range(3)))


if __name__ == "__main__":
    main()
