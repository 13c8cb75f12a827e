"""Issue 16: message priorities and -Q tiers (--queue-order strict), against real
RabbitMQ and a Python Celery 5.2 client. Orders are counted, never timed: the
fake LLM holds calls (hold=NAME) until released, so the worker's slots are full
and the next calls it starts are exactly the next ones in its ready queue."""
import re
import time

from kombu import Exchange, Queue

from conftest import wait_until


def node_of(w):
    m = re.search(r"(\S+) ready\.$", w.log(), re.M)
    assert m, w.log()
    return m.group(1)


def ready_depth(env, queue):
    """Messages the broker still holds for queue (not yet handed to a worker)."""
    out = env.services.ctl("list_queues", "-p", env.vhost, "name", "messages_ready").stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == queue:
            return int(parts[1])
    return None


def prompts(env):
    return [e["prompt"] for e in env.fake.stats()]


def test_priority_orders_ready_tasks_on_x_max_priority_queue(env):
    # the application declares the queue with x-max-priority 10; the worker
    # (declaring plainly) must fall back to using it as it is
    q = Queue("prio", Exchange("prio", "direct"), routing_key="prio",
              queue_arguments={"x-max-priority": 10})
    env.app.conf.task_queues = [q]
    with env.app.connection_for_write() as conn:
        q(conn.default_channel).declare()
    w = env.worker("-c", "1", "-Q", "prio", "--prefetch-multiplier", "20")
    node = node_of(w)
    env.fake.script(["hold=busy"])
    blocker = env.app.send_task("llm.generate", args=["blocker"], queue="prio")
    wait_until(lambda: len(env.fake.stats()) == 1, 10, what="the held call")
    # published while the only slot is busy: the worker's ready queue orders them
    prios = [3, 9, 0, 5, 9, 1, 5, 3]
    sent = []
    for i, p in enumerate(prios):
        r = env.app.send_task("llm.generate", args=["p%d-%d" % (p, i)], queue="prio",
                              priority=p)
        sent.append((p, i, r.id))
    wait_until(lambda: ready_depth(env, "prio") == 0, 10, what="all delivered")
    want = [tid for p, i, tid in sorted(sent, key=lambda t: (-t[0], t[1]))]
    ins = env.app.control.inspect(destination=[node], timeout=5)
    reserved = wait_until(lambda: (ins.reserved() or {}).get(node), 10,
                          what="reserved tasks")
    wait_until(lambda: len(ins.reserved()[node]) == len(prios), 10, what="all reserved")
    # inspect reserved lists them in the order they will run
    assert [t["id"] for t in ins.reserved()[node]] == want
    assert reserved
    env.fake.release("busy")
    blocker.get(timeout=20)
    for p, i, tid in sent:
        env.app.AsyncResult(tid).get(timeout=20)
    order = prompts(env)[1:]
    assert order == ["p%d-%d" % (p, i) for p, i, _ in sorted(sent, key=lambda t: (-t[0], t[1]))]


def test_strict_tiers_premium_overtakes_prefetched_free(env):
    # -c 50, window 200 per queue: 2,000 free tasks fill the free window
    # (50 running, held; 150 ready), then 100 premium tasks arrive
    w = env.worker("-c", "50", "-Q", "premium,free", "--queue-order", "strict")
    node = node_of(w)
    env.fake.script(["hold=free"] * 50)
    with env.app.producer_or_acquire() as prod:
        for i in range(2000):
            env.app.send_task("llm.generate", args=["free-%d" % i], queue="free",
                              producer=prod)
    wait_until(lambda: len(env.fake.stats()) == 50, 30, what="50 held free calls")
    wait_until(lambda: ready_depth(env, "free") == 1800, 30, what="free window full")
    # the premium calls are held too, in two named halves, so each phase fills
    # every slot and nothing else can start until the test lets it
    with env.app.producer_or_acquire() as prod:
        for i in range(100):
            env.app.send_task("llm.generate", args=["premium-%d" % i], queue="premium",
                              kwargs={"model": "fake/hold=p%d" % (i // 50)},
                              producer=prod)
    # a window of its own: premium is handed over while free's is full
    wait_until(lambda: ready_depth(env, "premium") == 0, 30, what="premium delivered")
    ins = env.app.control.inspect(destination=[node], timeout=10)
    reserved = [t["args"][0] for t in ins.reserved()[node]]
    assert len(reserved) == 250
    assert reserved[:100] == ["premium-%d" % i for i in range(100)]
    assert all(a.startswith("free-") for a in reserved[100:])
    assert ready_depth(env, "free") == 1800  # no more free came meanwhile

    env.fake.release("free")
    wait_until(lambda: len(env.fake.stats()) == 100, 30, what="first premium half")
    time.sleep(0.3)
    order = prompts(env)
    assert len(order) == 100
    assert sorted(order[50:]) == sorted("premium-%d" % i for i in range(50))

    env.fake.release("p0")
    wait_until(lambda: len(env.fake.stats()) == 150, 30, what="second premium half")
    time.sleep(0.3)
    order = prompts(env)
    assert len(order) == 150
    assert sorted(order[100:]) == sorted("premium-%d" % i for i in range(50, 100))

    # only then does free go on
    env.fake.release("p1")
    wait_until(lambda: len(env.fake.stats()) >= 250, 30, what="free again")
    assert all(p.startswith("free-") for p in prompts(env)[150:250])


def test_fair_is_the_default_arrival_order_across_queues(env):
    # no --queue-order: tasks of both queues start in the order they arrived
    # (which the broker decides across queues), as on a Python worker;
    # priority still orders among them
    w = env.worker("-c", "1", "-Q", "premium,free", "--prefetch-multiplier", "10")
    env.fake.script(["hold=busy"])
    env.app.send_task("llm.generate", args=["blocker"], queue="free")
    wait_until(lambda: len(env.fake.stats()) == 1, 10, what="the held call")
    sent = [("free", 0, "f0"), ("premium", 0, "p0"), ("free", 0, "f1"),
            ("premium", 0, "p1"), ("free", 4, "f4"), ("premium", 0, "p2")]
    rs = [env.app.send_task("llm.generate", args=[name], queue=q, priority=p)
          for q, p, name in sent]
    names = {r.id: name for r, (q, p, name) in zip(rs, sent)}
    w.wait_for(r"Task llm\.generate\[\S+\] received", 10, count=1 + len(sent))
    arrived = [names[m] for m in re.findall(r"llm\.generate\[(\S+)\] received", w.log())
               if m in names]
    assert len(arrived) == len(sent)
    env.fake.release("busy")
    for r in rs:
        r.get(timeout=20)
    prio = {name: p for q, p, name in sent}
    want = sorted(arrived, key=lambda n: -prio[n])  # stable: arrival within a priority
    assert prompts(env)[1:] == want


def test_strict_eta_tasks_still_run_and_wait_in_their_tier(env):
    # held eta tasks count against their queue's own window under strict order;
    # they still run at their time, and ready tasks of both tiers run meanwhile
    env.worker("-c", "2", "-Q", "premium,free", "--queue-order", "strict")
    later = [env.app.send_task("llm.generate", args=["eta-%d" % i], queue="free",
                               countdown=2) for i in range(3)]
    now = [env.app.send_task("llm.generate", args=["now-%s" % q], queue=q)
           for q in ("free", "premium")]
    for r in now:
        r.get(timeout=20)
    assert not any(p.startswith("eta-") for p in prompts(env))
    for r in later:
        r.get(timeout=20)
    assert sorted(prompts(env)[2:]) == ["eta-0", "eta-1", "eta-2"]
