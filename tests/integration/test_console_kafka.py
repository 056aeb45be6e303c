"""The console over the Kafka topics (``effects console --bootstrap/--prefix``): the known incident
produced to fresh topics and folded by a real processor (the fixture of ``test_ops_kafka.py``),
read through the console's API over real HTTP; a decision written to ``effects.decisions``."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator

import pytest

from effect_ledger.console.auth import Credentials
from effect_ledger.console.source import Source
from tests.console_server import serve
from tests.integration.test_ops_kafka import Setup, setup  # noqa: F401  (the module's fixture)
from tests.topic_io import Record, TopicReader
from tests.unit.console.test_console_api import call, get_json

pytestmark = pytest.mark.integration
TOKEN = "kafka-console-token"


@pytest.fixture(scope="module")
def url(setup: Setup) -> Iterator[str]:  # noqa: F811
    with serve(Source(cfg=setup.cfg), Credentials(TOKEN)) as base:
        yield base


def test_the_console_reads_the_topics(url: str, setup: Setup) -> None:  # noqa: F811
    d = get_json(url, "/api/effects?from=-1h")
    # The processor timed out the five stuck effects (nobody can answer for them): UNCERTAIN.
    assert d["by_state"] == {"CONFIRMED": 995, "UNCERTAIN": 5}
    assert d["by_target"] == {"payments": 900, "tickets": 100}
    uncertain = get_json(url, "/api/effects?from=-1h&state=UNCERTAIN")
    assert sorted(e["effect_id"] for e in uncertain["effects"]) == sorted(setup.inc.stuck)
    stuck = get_json(url, "/api/stuck?older_than=10m")
    assert sorted(r["effect_id"] for r in stuck["stuck"]) == sorted(setup.inc.stuck)
    t = get_json(url, "/api/trace/" + urllib.parse.quote(setup.inc.doubled[0], safe=""))
    assert t["sent_unrecorded_ms"] == [2, 2]
    status, text = call(url, "/api/effects?from=-1h&to=-2h")
    assert status == 400 and "empty window" in json.loads(text)["error"]


def test_a_decision_through_the_console_lands_on_the_decisions_topic(url: str, setup: Setup) -> None:  # noqa: F811
    key = setup.inc.stuck[0]
    body = {"key": key, "decision": "ABANDONED", "reason": "never reached the gateway", "by": "carol"}
    status, _ = call(url, "/api/resolve", body, "Bearer wrong")
    assert status == 401
    status, text = call(url, "/api/resolve", body, f"Bearer {TOKEN}")
    assert status == 200 and setup.cfg.topics.decisions in json.loads(text)["recorded"]

    def mine(records: list[Record]) -> bool:
        return any(
            getattr(r.value, "effect_id", None) == key and getattr(r.value, "by", None) == "carol" for r in records
        )

    with TopicReader(setup.cfg, setup.cfg.topics.decisions) as decisions:
        decisions.until(
            mine,
            60,
            "the console's decision on effects.decisions",
        )


def test_search_and_an_effect_page_over_the_topics(setup: Setup) -> None:  # noqa: F811
    # The incident's requests are {"n": i}: declared searchable, n finds one effect by its value.
    from effect_ledger import Target
    from effect_ledger.core.keys import effect_key

    targets = [Target("payments", searchable=("n",)), Target("tickets", searchable=("n",))]
    with serve(Source(cfg=setup.cfg, targets=targets), Credentials(TOKEN)) as base:
        key = effect_key("payments", "create", "incident-run", "step-42")
        for search in ("n:42", "42", "step:step-42", "run:incident-run step:step-42"):
            d = get_json(base, "/api/effects?" + urllib.parse.urlencode({"from": "-1h", "q": search}))
            assert [e["effect_id"] for e in d["effects"]] == [key], search
        assert get_json(base, "/api/effects?from=-1h&q=n:100000")["matched"] == 0
        status, page = call(base, "/effect/" + urllib.parse.quote(key, safe=""))
        assert status == 200 and "step-42" in page and "incident-run" in page
        assert '<td>n <span class="tag">searchable</span></td><td><code>42</code>' in page
        assert "only the first 100 are listed" in page  # the run holds 1,000 effects
