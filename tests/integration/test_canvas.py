"""Issue 16: Python Celery 5.2.6 canvases (chain, link, link_error, group, chord,
and their nestings, also from protocol 1 clients) run on celeriac with the
results, states and ids a Python worker gives.

celery.accumulate(*args, index=None) is the worker's arithmetic: it returns its
args as a list, or args[index]; index=9 on a short list fails with IndexError.
"""
import uuid

import pytest
from celery import chain, chord, group

T = 30  # every wait is bounded


def acc(app, *args, **kw):
    return app.signature("celery.accumulate", args=args, kwargs=kw)


@pytest.mark.brokers("amqp", "sqs")
def test_chain_three_steps(env):
    env.worker("-c", "4")
    res = chain(acc(env.app, 1), acc(env.app, 2), acc(env.app, 3))()
    # each step gets the previous result prepended to its own args
    assert res.get(timeout=T) == [[[1], 2], 3]
    assert res.parent.get(timeout=T) == [[1], 2]
    first = res.parent.parent
    assert first.get(timeout=T) == [1]
    # ids as a Python worker sets them: root = the first step, parent = the step before
    m2, m3 = env.meta(res.parent.id), env.meta(res.id)
    assert m2["status"] == m3["status"] == "SUCCESS"
    assert env.meta(first.id)["status"] == "SUCCESS"


def test_chain_immutable_step(env):
    env.worker("-c", "4")
    app = env.app
    res = chain(acc(app, 1), app.signature("celery.accumulate", args=(5, 5), immutable=True),
                acc(app, index=0))()
    # the .si() step ignores the result before it; the next one gets its result
    assert res.parent.get(timeout=T) == [5, 5]
    assert res.get(timeout=T) == [5, 5]


def test_chain_middle_step_fails(env):
    env.worker("-c", "4")
    app = env.app
    res = chain(acc(app, 1), acc(app, index=9), acc(app, 3), acc(app, 4))()
    with pytest.raises(IndexError):
        res.get(timeout=T)
    # the failed step's error is stored on every later step, so .get() returns
    failed = res.parent.parent
    assert env.meta(failed.id)["status"] == "FAILURE"
    for r in (res, res.parent):
        meta = env.meta(r.id)
        assert meta["status"] == "FAILURE"
        assert meta["result"]["exc_type"] == "IndexError"
    assert res.parent.parent.parent.get(timeout=T) == [1]


def test_link_and_link_error(env):
    env.worker("-c", "4")
    app = env.app
    cb_id, eb_id = str(uuid.uuid4()), str(uuid.uuid4())
    r = app.send_task("celery.accumulate", args=(7,),
                      link=app.signature("celery.accumulate", args=("cb",), task_id=cb_id))
    assert r.get(timeout=T) == [7]
    assert app.AsyncResult(cb_id).get(timeout=T) == [[7], "cb"]
    # errbacks get the failed task's id, as Celery gives a task it cannot call inline
    f = app.send_task("celery.accumulate", args=(1,), kwargs={"index": 9},
                      link_error=app.signature("celery.accumulate", args=("eb",),
                                               task_id=eb_id))
    with pytest.raises(IndexError):
        f.get(timeout=T)
    assert app.AsyncResult(eb_id).get(timeout=T) == [f.id, "eb"]


def test_several_callbacks(env):
    env.worker("-c", "4")
    app = env.app
    ids = [str(uuid.uuid4()) for _ in range(3)]
    links = [app.signature("celery.accumulate", args=(i,), task_id=ids[i]) for i in range(3)]
    r = app.send_task("celery.accumulate", args=("x",), link=links)
    assert r.get(timeout=T) == ["x"]
    for i in range(3):
        assert app.AsyncResult(ids[i]).get(timeout=T) == [["x"], i]


def test_group_of_50(env):
    env.worker("-c", "20")
    res = group(acc(env.app, i, index=0) for i in range(50))()
    assert res.get(timeout=60) == list(range(50))


def test_chord_of_100_with_body(env):
    env.worker("-c", "20")
    res = chord([acc(env.app, i, index=0) for i in range(100)])(acc(env.app, "end"))
    out = res.get(timeout=60)
    assert out == [list(range(100)), "end"]


@pytest.mark.brokers("amqp", "sqs")
def test_chain_inside_chord_header(env):
    env.worker("-c", "8")
    app = env.app
    header = [acc(app, 3, index=0),
              chain(acc(app, 1, index=0), acc(app, index=0)),
              acc(app, 2, index=0)]
    res = chord(header)(acc(app, index=0))
    assert res.get(timeout=T) == [3, 1, 2]


def test_chord_inside_chain(env):
    env.worker("-c", "8")
    app = env.app
    # chain(a, group(...), b) is sent as a chord by the client; a chord step
    # runs with the result of the step before prepended to each header task
    res = chain(acc(app, 10, index=0), group(acc(app, 1), acc(app, 2)),
                acc(app, "body"), acc(app, "after"))()
    assert res.get(timeout=T) == [[[[10, 1], [10, 2]], "body"], "after"]
    res2 = chain(acc(app, 5, index=0),
                 chord([acc(app, "h1"), acc(app, "h2")], acc(app, "b")))()
    assert res2.get(timeout=T) == [[[5, "h1"], [5, "h2"]], "b"]


def test_protocol1_link_and_chord(env):
    env.worker("-c", "8")
    app = env.make_app(task_protocol=1)
    cb_id = str(uuid.uuid4())
    r = app.send_task("celery.accumulate", args=(4,),
                      link=app.signature("celery.accumulate", args=(1,), task_id=cb_id))
    assert r.get(timeout=T) == [4]
    assert app.AsyncResult(cb_id).get(timeout=T) == [[4], 1]
    res = chord([acc(app, i, index=0) for i in range(5)], app=app)(acc(app, index=0))
    assert res.get(timeout=T) == [0, 1, 2, 3, 4]
    app.close()


def test_readme_llm_pipeline(env):
    """The README's Canvas example, as written there: a chord that summarizes each
    chunk and then the summaries, and the same as a map in a chain."""
    from celery.canvas import xmap
    env.worker("-c", "8")
    app = env.app
    gen = app.signature("llm.generate")
    chunks = ["first part", "second part", "third part"]
    summary = chord(
        [gen.clone(args=(c,), kwargs={"template": "Summarize:\n{input}"}) for c in chunks],
        gen.clone(kwargs={"template": "Summarize these summaries:\n{input}"}),
    )()
    out = summary.get(timeout=T)
    assert isinstance(out, str) and out
    pipeline = chain(
        xmap(gen, ["Summarize:\n" + c for c in chunks], app=app),
        gen.clone(kwargs={"template": "Summarize these summaries:\n{input}"}),
    )()
    assert isinstance(pipeline.get(timeout=T), str)
    prompts = [e["prompt"] for e in env.fake.stats()]
    # three header calls and one body per pipeline; each body saw the three
    # summaries, in header order, joined by newlines inside its template
    assert sum(p.startswith("Summarize:\n") for p in prompts) == 6
    bodies = [p for p in prompts if p.startswith("Summarize these summaries:\n")]
    assert len(bodies) == 2
    for b in bodies:
        assert len(b.split("\n")) >= 4
