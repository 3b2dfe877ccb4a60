"""The pricing task of issue 21 on other price lists: generated variants (fixed seed), not the one
README example. Each variant names the tool ("Use the multiply tool ..."), so the grammar makes the
first action a multiply call; the agent must pick the right two numbers of the list (the asked
quantity and the asked item's price, not its neighbour's) and answer with the tool's result."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from agent import Agent, RunResult, tool
from runtime.backends import connect

#: nouns whose plural is the noun + "s"
ITEMS = (
    "pen", "notebook", "stapler", "mug", "candle", "towel", "lamp", "ruler", "bottle", "basket",
    "kettle", "pillow", "folder", "plate", "spoon", "blanket",
)  # fmt: skip
SEED = 2117  # fixed: the variants are the same on every run


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


@tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@dataclass(frozen=True, slots=True)
class Variant:
    task: str
    quantity: int
    price: float
    position: int  # of the asked item in its list (0-based)

    @property
    def total(self) -> float:
        return round(self.quantity * self.price, 2)


def pricing_variants(count: int, seed: int = SEED) -> list[Variant]:
    """`count` price lists of 3-4 items; the asked item sits anywhere in its list."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        names = rng.sample(ITEMS, rng.choice((3, 4)))
        prices = [p / 100 for p in rng.sample(range(150, 1500, 25), len(names))]  # distinct
        quantity = rng.choice([q for q in range(2, 13) if q not in prices])  # never equal to a price
        target = rng.randrange(len(names))
        listing = ", ".join(f"{n} {p:.2f} dollars" for n, p in zip(names, prices, strict=True))
        task = (
            f"Price list: {listing}. Use the multiply tool to find the price of {quantity} {names[target]}s."
        )
        out.append(Variant(task, quantity, prices[target], target))
    return out


def shop_agent(backend) -> Agent:
    return Agent(
        backend,
        system="You are a shop assistant.",
        tools=[multiply, add],
        max_steps=4,
        sampling={"max_new_tokens": 48},
    )


def check(variant: Variant, result: RunResult) -> tuple[bool, list[dict]]:
    """Right: multiply called on (quantity, price) and the answer holds the product."""
    calls = [r.tool for r in result.trace if r.tool is not None]
    called = bool(calls) and calls[0]["name"] == "multiply" and calls[0]["error"] is None
    args = sorted(float(v) for v in (calls[0]["arguments"] or {}).values()) if called else []
    right_args = args == sorted([float(variant.quantity), variant.price])
    answer = (result.answer or "").replace(",", "")
    right_answer = any(_close(token, variant.total) for token in answer.replace("$", " ").split())
    return called and right_args and right_answer, calls


def _close(token: str, value: float) -> bool:
    try:
        return abs(float(token.strip(".")) - value) < 0.005
    except ValueError:
        return False


def test_variants_are_varied_and_reproducible():
    first, again = pricing_variants(5), pricing_variants(5)
    assert first == again
    assert len({v.task for v in first}) == 5
    assert len({v.position for v in first}) >= 2  # the asked item is not always in the same place


@pytest.mark.slow
@pytest.mark.xfail(
    strict=False,
    reason="open (issue 21): measured 1/5 on 2026-12-02 with the built-in protocol examples (2/5 "
    "with two more price-list examples, not kept): the model multiplies by another item's price",
)
def test_pricing_agent_is_right_on_most_price_lists(engine):
    backend = connect(engine)
    variants = pricing_variants(5)
    outcomes = [check(v, shop_agent(backend).run(v.task))[0] for v in variants]
    assert sum(outcomes) >= 4, outcomes
