"""Issue 37: a provider outage is said at the default log level. Retried failures log
at INFO only, so with every call timing out a worker at WARNING wrote nothing. Now
each provider gets one WARNING when its calls start failing, and one when they answer
again; the calls in between are counted, not logged."""
import json
import re
import time

import pytest

from conftest import wait_until

# Retries without end and close together, so the outage is many failed calls.
FAST = ["--retry-backoff", "0.2", "--retry-backoff-factor", "2", "--retry-backoff-max",
        "1", "--retry-jitter", "false", "--max-retries", "-1"]
PROVIDERS = ("default", "backup")


def lines_after_ready(w):
    lines = w.lines[:]
    for i, l in enumerate(lines):
        if l.endswith(" ready."):
            return lines[i + 1:]
    return []


def number(lines, pattern):
    for l in lines:
        m = re.search(pattern, l)
        if m:
            return int(m.group(1))
    raise AssertionError("no line matches %r" % pattern)


def count(lines, pattern):
    rx = re.compile(pattern)
    return sum(1 for l in lines if rx.search(l))


@pytest.mark.parametrize("failure", ["latency_ms=3000", "status=503"],
                         ids=["timeouts", "503s"])
def test_outage_warned_once_per_provider(env, failure):
    # Two providers on the one fake: the default (OPENAI_BASE_URL) and a named one.
    doc = {"providers": {"backup": {"type": "openai", "base_url": env.fake.base + "/v1",
                                    "timeouts": {"first_byte": 0.5}}}}
    # Every call fails: answered after 3 s to a worker that waits 0.5 s, or a 503.
    env.fake._req("POST", "/__config", {"defaults": failure})
    # --loglevel warning is the default; said here because env.worker asks for info.
    w = env.worker(*FAST, "-c", "8", "--llm-first-byte-timeout", "0.5",
                   "--llm-providers", json.dumps(doc), "--loglevel", "warning")
    models = {"default": None, "backup": "backup/fake-model"}
    sent = []
    for i in range(4):
        for name in PROVIDERS:
            kw = {"model": models[name]} if models[name] else {}
            sent.append(("%s-%d" % (name, i),
                         env.app.send_task("llm.generate", args=["%s-%d" % (name, i)],
                                           kwargs=kw)))
    t0 = time.time()
    for name in PROVIDERS:
        w.wait_for(r"WARNING.*LLM provider %s failing: \d+ calls in a row failed" % name,
                   timeout=60)
    # The outage goes on: a dozen more failed calls per provider, and not a line more.
    base = len(env.fake.stats())
    wait_until(lambda: len(env.fake.stats()) >= base + 24, 60, what="more failed calls")
    assert all(not env.meta(r.id) or env.meta(r.id)["status"] == "RETRY" for _, r in sent)
    env.fake._req("POST", "/__config", {"defaults": "tokens=3"})
    for prompt, r in sent:
        assert r.get(timeout=90) == env.fake.expected_text(prompt, tokens=3)
    for name in PROVIDERS:
        w.wait_for(r"WARNING.*LLM provider %s recovered after [\d.]+s \(\d+ failed calls\)"
                   % name, timeout=30)
    elapsed = time.time() - t0
    lines = lines_after_ready(w)
    failed = 0
    for name in PROVIDERS:
        assert count(lines, r"LLM provider %s failing:" % name) == 1, "\n".join(lines)
        assert count(lines, r"LLM provider %s recovered" % name) == 1, "\n".join(lines)
        first = number(lines, r"LLM provider %s failing: (\d+) calls" % name)
        last = number(lines, r"LLM provider %s recovered .*\((\d+) failed calls\)" % name)
        assert 2 <= first <= last, "\n".join(lines)
        failed += last
        # A reminder only if the outage outlasted its minute (a loaded machine).
        assert count(lines, r"LLM provider %s still failing" % name) <= elapsed // 60
    # Most of the outage's calls are in the counts (a few in flight at the switch
    # may end after the first success, and are not).
    assert failed >= 20, "\n".join(lines)
    # No line per failed call: the only lines naming a failure are the provider's.
    assert count(lines, r"APITimeoutError|InternalServerError|Error code: 503") == \
        count(lines, r"LLM provider \S+ (failing|still failing):"), "\n".join(lines)
    assert len(lines) <= 8, "\n".join(lines)
