"""Request bodies per target (full, redacted by field, digest only, encrypted with an erasable key)
and erasure: what the intent records, that "same key, different request" is still caught, and
what the audit still proves about an erased effect."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from effect_ledger.cli.main import main
from effect_ledger.core.bodies import REDACTED, WITHHELD, BodyMode, BodyPolicy, redacted
from effect_ledger.core.model import Intent
from effect_ledger.core.reconcile import EffectView, Found, Target
from effect_ledger.errors import BodyErased, EffectConflict, TargetsError
from effect_ledger.ops.audit import audit
from effect_ledger.ops.sources import db_events
from effect_ledger.sdk import erasure
from effect_ledger.sdk.ledger import Ledger
from effect_ledger.targets.ask import CallableReconciler
from effect_ledger.targets.load import parse_targets
from tests.sdk_contract import OPERATION, RUN_ID, TARGET, Destination, FakeClock, run

EMAIL = "jane.doe@example.com"
REQUEST = {"order": "123", "amount": 4800, "customer": {"id": "cus_42", "email": EMAIL, "name": "Jane Doe"}}


def test_targets_file_declares_a_body_policy_per_target() -> None:
    targets = parse_targets(
        """
[targets.payments]
lookup = "none"
body = "redact"
redact = ["customer.email", "customer.name"]

[targets.mail]
lookup = "none"
body = "encrypt"
subject = "customer.id"

[targets.sms]
lookup = "none"
body = "digest"

[targets.plain]
lookup = "none"
"""
    )
    by = {t.name: t.body for t in targets}
    assert by["payments"] == BodyPolicy(BodyMode.REDACT, ("customer.email", "customer.name"))
    assert by["mail"] == BodyPolicy(BodyMode.ENCRYPT, subject="customer.id")
    assert by["sms"].mode is BodyMode.DIGEST and by["plain"].mode is BodyMode.FULL


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ('body = "secret"', "t.toml:4: target 'p': body must be one of 'full', 'redact', 'digest', 'encrypt'"),
        ('body = "redact"', "t.toml:4: target 'p': body = \"redact\" needs the fields to redact"),
        ('redact = ["email"]', "t.toml:4: target 'p': redact = [...] applies to body = \"redact\" only"),
        ('body = "redact"\nredact = ["a..b"]', "t.toml:5: target 'p': 'a..b' is not a field path"),
    ],
)
def test_a_bad_body_policy_is_one_line_with_file_and_line(settings: str, message: str) -> None:
    with pytest.raises(TargetsError) as info:
        parse_targets(f'\n[targets.p]\nlookup = "none"\n{settings}\n', "t.toml")
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_redaction_reaches_into_lists_and_leaves_the_rest() -> None:
    value = {"items": [{"email": "a"}, {"email": "b", "n": 1}], "email": "c", "keep": True}
    assert redacted(value, ("items.email", "missing.path")) == {
        "items": [{"email": REDACTED}, {"email": REDACTED, "n": 1}],
        "email": "c",
        "keep": True,
    }


async def _intents(ledger: Ledger) -> list[Intent]:
    rows = await ledger.store.query("SELECT body FROM events WHERE kind = 'Intent' ORDER BY seq")
    return [ledger.store.codec.decode(r["body"]) for r in rows]


def _file_bytes(path: Path) -> bytes:
    wal = path.with_name(path.name + "-wal")
    return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


@pytest.mark.parametrize("mode", ["redact", "digest", "encrypt"])
def test_personal_data_never_reaches_the_record_and_conflicts_are_still_caught(tmp_path: Path, mode: str) -> None:
    policy = {
        "redact": BodyPolicy(BodyMode.REDACT, ("customer.email", "customer.name")),
        "digest": BodyPolicy(BodyMode.DIGEST),
        "encrypt": BodyPolicy(BodyMode.ENCRYPT, subject="customer.id"),
    }[mode]
    path = tmp_path / "e.db"
    dest = Destination()

    async def body() -> None:
        ledger = await Ledger.open(str(path), targets=[Target(TARGET, body=policy)], clock=FakeClock())
        try:
            done = await ledger.execute(
                target=TARGET, operation=OPERATION, run_id=RUN_ID, step="s1", request=REQUEST, call=dest
            )
            assert done.called
            (intent,) = await _intents(ledger)
            assert EMAIL not in intent.request and "Jane Doe" not in intent.request
            if mode == "redact":
                assert json.loads(intent.request)["customer"] == {"id": "cus_42", "email": REDACTED, "name": REDACTED}
                assert json.loads(intent.request)["amount"] == 4800
            elif mode == "digest":
                assert json.loads(intent.request) == {WITHHELD: {"sha256": intent.request_digest}}
            else:
                assert erasure.is_sealed(intent.request)
                opened = await erasure.open_body(ledger.keyring, done.effect_id, intent.request, intent.request_digest)
                assert opened == REQUEST
            # The same key with a different request is still a conflict (the digest is the full request's).
            changed = {**REQUEST, "customer": {**REQUEST["customer"], "email": "other@example.com"}}  # type: ignore[dict-item]
            with pytest.raises(EffectConflict):
                await ledger.execute(
                    target=TARGET, operation=OPERATION, run_id=RUN_ID, step="s1", request=changed, call=dest
                )
            # The same request is recognised: the recorded receipt, no second call.
            again = await ledger.execute(
                target=TARGET, operation=OPERATION, run_id=RUN_ID, step="s1", request=REQUEST, call=dest
            )
            assert not again.called and len(dest.calls) == 1
        finally:
            await ledger.close()
        assert EMAIL.encode() not in _file_bytes(path)

    run(body())


def test_erasing_a_subject_makes_its_bodies_unreadable_and_the_audit_still_passes(tmp_path: Path) -> None:
    path = tmp_path / "e.db"
    dest = Destination()
    clock = FakeClock()
    policy = BodyPolicy(BodyMode.ENCRYPT, subject="customer.id")
    other = {**REQUEST, "customer": {"id": "cus_7", "email": "x@example.com"}}

    async def body() -> None:
        ledger = await Ledger.open(str(path), targets=[Target(TARGET, body=policy)], clock=clock)
        try:
            for step, req in (("s1", REQUEST), ("s2", REQUEST), ("s3", other)):
                await ledger.execute(
                    target=TARGET, operation=OPERATION, run_id=RUN_ID, step=step, request=req, call=dest
                )
            before = await _intents(ledger)
            assert len({erasure.key_id(i.request) for i in before}) == 2  # one key per subject
            assert await erasure.erase(ledger.store, "cus_42") == 1
            assert await erasure.erase(ledger.store, "cus_42") == 0  # idempotent
            after = await _intents(ledger)
            assert after == before  # the events are untouched: states, times, digests all stay
            for i in after[:2]:
                with pytest.raises(BodyErased):
                    await erasure.open_body(ledger.keyring, i.effect_id, i.request, i.request_digest)
            assert await erasure.open_body(
                ledger.keyring, after[2].effect_id, after[2].request, after[2].request_digest
            )
            # The erased subject's effects are still known, CONFIRMED, with their receipts.
            effect = await ledger.get(after[0].effect_id)
            assert effect is not None and effect.state.value == "CONFIRMED" and effect.receipt is not None
        finally:
            await ledger.close()
        report = audit(db_events(path), clock() - 3_600_000, clock() + 1, clock() + 1)
        assert report.passed and report.undecodable == 0
        assert {c.name: c.numerator for c in report.checks}["keyed_writes"] == 3

    run(body())


def test_a_reconciler_is_shown_the_opened_body_until_it_is_erased(tmp_path: Path) -> None:
    seen: list[Any] = []

    def check(v: EffectView) -> Any:
        seen.append(v.request)
        return Found("re_found")

    dest = Destination()
    dest.fail.append(TimeoutError("lost"))
    policy = BodyPolicy(BodyMode.ENCRYPT)  # per-effect keys: the subject is the effect key
    clock = FakeClock()

    async def body() -> None:
        target = Target(TARGET, reconciler=CallableReconciler(check, name="asks"), body=policy)
        ledger = await Ledger.open(str(tmp_path / "e.db"), targets=[target], clock=clock)
        try:
            with pytest.raises(Exception):  # noqa: B017  (the call's outcome is unknown)
                await ledger.execute(
                    target=TARGET, operation=OPERATION, run_id=RUN_ID, step="s", request=REQUEST, call=dest
                )
            clock.advance(60_000)
            (intent,) = await _intents(ledger)
            await ledger.reconcile(intent.effect_id)
            assert seen == [REQUEST]
        finally:
            await ledger.close()

    run(body())


def test_effects_erase_cli(tmp_path: Path) -> None:
    path = tmp_path / "e.db"

    async def body() -> None:
        policy = BodyPolicy(BodyMode.ENCRYPT, subject="customer.id")
        ledger = await Ledger.open(str(path), targets=[Target(TARGET, body=policy)], clock=FakeClock())
        try:
            await ledger.execute(
                target=TARGET, operation=OPERATION, run_id=RUN_ID, step="s", request=REQUEST, call=Destination()
            )
        finally:
            await ledger.close()

    run(body())
    cli = CliRunner()
    ok = cli.invoke(main, ["erase", "--db", str(path), "--subject", "cus_42"])
    assert ok.exit_code == 0 and "erased 1 key" in ok.output
    again = cli.invoke(main, ["erase", "--db", str(path), "--subject", "cus_42", "--json"])
    assert again.exit_code == 0 and json.loads(again.output) == {"subject_keys_erased": 0}
    missing = cli.invoke(main, ["erase", "--db", str(tmp_path / "nope.db"), "--subject", "cus_42"])
    assert missing.exit_code != 0
    bad = cli.invoke(main, ["erase", "--db", str(path), "--subject", ""])
    assert bad.exit_code == 1 and bad.output.count("\n") == 1 and bad.output.startswith("effects: ")


def test_a_redacted_body_is_bounded_like_the_request() -> None:
    from effect_ledger.core.keys import canonical_request
    from effect_ledger.errors import EffectTooLarge
    from effect_ledger.sdk.bodies import stored

    # Twenty-five thousand one-character e-mails: within the request limit, but their redaction is not.
    canonical, digest = canonical_request({"to": [{"e": "x"} for _ in range(25_000)]})
    policy = BodyPolicy(BodyMode.REDACT, ("to.e",))
    with pytest.raises(EffectTooLarge):
        run(stored(policy, None, "k", canonical, digest, 0))  # type: ignore[arg-type]  # no keys needed
