"""@tool: schema from signature + docstring, validation/exception/timeout as results."""

from __future__ import annotations

import asyncio
import json
import time

from agent import canonical_json, tool


@tool(expected_s=1.5)
def lookup(city: str, year: int = 2020) -> dict:
    """Look up a city's population.

    Args:
        city: the city's name
        year: census year
    """
    if city == "Atlantis":
        raise KeyError(city)
    return {"city": city, "year": year, "population": 1000}


@tool(timeout_s=0.05)
def slow(seconds: float) -> str:
    """Sleep."""
    time.sleep(seconds)
    return "done"


@tool(timeout_s=0.05)
async def aslow(seconds: float) -> str:
    """Sleep asynchronously."""
    await asyncio.sleep(seconds)
    return "done"


def test_schema_from_signature_and_docstring():
    spec = lookup.spec()
    assert spec["name"] == "lookup" and spec["description"] == "Look up a city's population."
    params = spec["parameters"]
    assert params["required"] == ["city"]
    assert params["properties"]["city"] == {"type": "string", "description": "the city's name"}
    assert params["properties"]["year"]["default"] == 2020
    assert params["additionalProperties"] is False
    assert "title" not in json.dumps(params)
    assert lookup.expected_s == 1.5


def test_canonical_json_is_order_independent():
    assert canonical_json({"b": 1, "a": {"d": 2, "c": 3}}) == canonical_json({"a": {"c": 3, "d": 2}, "b": 1})
    assert lookup.spec_json() == canonical_json(json.loads(lookup.spec_json()))


def test_success_and_structured_result():
    result = lookup.invoke({"city": "Oslo"})
    assert result.ok and json.loads(result.result) == {"city": "Oslo", "population": 1000, "year": 2020}


def test_validation_errors_are_results():
    bad_type = lookup.invoke({"city": "Oslo", "year": "soon"})
    assert not bad_type.ok and bad_type.error_kind == "validation" and "year" in bad_type.error
    extra = lookup.invoke({"city": "Oslo", "planet": "Mars"})
    assert extra.error_kind == "validation" and "planet" in extra.error
    assert lookup.invoke(["Oslo"]).error_kind == "validation"
    assert lookup.invoke({}).error_kind == "validation"


def test_exceptions_and_timeouts_are_results():
    failed = lookup.invoke({"city": "Atlantis"})
    assert failed.error_kind == "exception" and "KeyError" in failed.error
    assert slow.invoke({"seconds": 1.0}).error_kind == "timeout"
    assert slow.invoke({"seconds": 0.0}).result == "done"
    assert aslow.invoke({"seconds": 1.0}).error_kind == "timeout"
    assert aslow.invoke({"seconds": 0.0}).result == "done"


def test_decorated_tool_still_callable():
    assert lookup("Oslo")["population"] == 1000
