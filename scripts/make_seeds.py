"""Write the dimension seed files under conf/seeds/ (deterministic; re-run to regenerate).

Usage: .venv/bin/python scripts/make_seeds.py
"""

from __future__ import annotations

import csv
import random
from decimal import Decimal
from pathlib import Path

CATEGORIES = ["beverages", "books", "electronics", "garden", "home", "kitchen", "sports", "toys"]
COUNTRIES = ["DE", "FR", "GB", "ES", "IT", "NL", "US", "PL", "SE", "IE"]
SEGMENTS = ["consumer", "small_business", "enterprise"]
WORDS = ["alpha", "bold", "calm", "deep", "easy", "fine", "grand", "happy", "ideal", "jolly"]


def main() -> None:
    rng = random.Random(2026)
    out = Path(__file__).resolve().parent.parent / "conf" / "seeds"
    out.mkdir(parents=True, exist_ok=True)
    with (out / "products.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["product_id", "name", "category", "list_price"])
        for n in range(1, 301):
            price = (Decimal(rng.randrange(10, 50_000)) / 100).quantize(Decimal("0.01"))
            name = f"{rng.choice(WORDS).title()} {rng.choice(WORDS)} {n}"
            w.writerow([f"p-{n:04d}", name, rng.choice(CATEGORIES), price])
    with (out / "customers.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["customer_id", "name", "country", "segment"])
        for n in range(1, 3001):
            w.writerow([f"c-{n:05d}", f"Customer {n}", rng.choice(COUNTRIES), rng.choice(SEGMENTS)])


if __name__ == "__main__":
    main()
