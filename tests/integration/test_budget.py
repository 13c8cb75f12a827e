"""Issue 38, budgets: a provider's daily budget in USD, counted across the
fleet in the result backend's Redis. Once the fleet's spend reaches it, a
call to that provider fails at once with BudgetExceeded (dead-lettered, never
sent), on every worker, including one that made no call yet."""
import json
import time

from conftest import wait_until

# 5,000 USD per million tokens: a short chat (about 7 tokens) costs 3.5 cents.
DOC = {"providers": {"default": {"prices": {"*": {"input": 5000, "output": 5000}},
                                 "budget": {"usd_per_day": 0.05}}}}


def chat(env, text, queue="celery"):
    return env.app.send_task("llm.chat", args=[[{"role": "user", "content": text}]],
                             kwargs={"model": "priced"}, queue=queue)


def test_budget_stops_calls_across_the_fleet(env):
    a = env.worker("-c", "1", "--llm-providers", json.dumps(DOC))
    env.fake.script(["tokens=5"] * 2)
    costs = [chat(env, "spend %d" % i).get(timeout=20)["usage"]["cost"] for i in range(2)]
    assert all(c > 0.02 for c in costs), costs  # two calls pass the 0.05 line
    calls = len(env.fake.stats())
    r = chat(env, "over")
    try:
        r.get(timeout=20)
        assert False, "a call past the budget ran"
    except Exception as e:
        assert type(e).__name__ == "BudgetExceeded", repr(e)
    meta = env.meta(r.id)
    assert meta["status"] == "FAILURE" and "reached its budget of 0.05 USD" in \
        meta["result"]["exc_message"][0], meta
    assert len(env.fake.stats()) == calls  # never sent
    a.wait_for(r"Task llm\.chat\[%s\] not sent: provider default reached its budget" % r.id)
    # the fleet's count, in the backend's Redis, under today's UTC date
    key = "celeriac:spend:default:" + time.strftime("%Y-%m-%d", time.gmtime())
    wait_until(lambda: env.redis.get(key) is not None, 10, what="the shared count")
    assert abs(float(env.redis.get(key)) - sum(costs)) < 1e-6
    assert 0 < env.redis.ttl(key) <= 172800
    # a second worker that never called learns the fleet's spend from Redis
    b = env.worker("-c", "1", "-Q", "other", "--llm-providers", json.dumps(DOC))
    time.sleep(2.5)  # its first read of the count (at start, then every 2 s)
    r2 = chat(env, "other worker", queue="other")
    try:
        r2.get(timeout=20)
        assert False, "the second worker called past the fleet's budget"
    except Exception as e:
        assert type(e).__name__ == "BudgetExceeded", repr(e)
    assert len(env.fake.stats()) == calls
    assert b.count("not sent: provider default reached its budget") == 1


def test_budget_needs_a_number(env):
    bad = {"providers": {"default": {"budget": {"usd_per_day": -1}}}}
    w = env.worker("--llm-providers", json.dumps(bad), start=False)
    w.start(wait_ready=False)
    w.wait_for(r"usd_per_day must be a number of USD")
