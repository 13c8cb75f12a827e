"""Issue 35: JSON logs. One object per line with the task's id and name, the
worker and the source logger; whatever a publisher puts in a task id, each
line parses and forges nothing."""
import json

IDS = ["plain-id", 'q"uote', "new\nline", "\x1b[31mred", "back\\slash", "caf\u00e9",
       "a] b", '"}],{"level":"CRITICAL"']


def lines_of(w):
    out = []
    for line in w.log().split("\n"):
        if line:
            out.append(json.loads(line))  # every line is one object
    return out


def test_json_logs_parse_with_hostile_task_ids(env):
    w = env.worker("--log-format", "json", start=False)
    w.start(wait_ready=False)
    w.wait_for(r' ready\.",')
    for tid in IDS:
        assert env.app.send_task("llm.generate", args=["hi"], task_id=tid).get(timeout=30)
    w.wait_for(r'"task_id":"\\"}\],{\\"level\\":\\"CRITICAL\\"","task_name":"llm.generate"}$',
               timeout=30, count=2)
    objs = lines_of(w)
    assert all({"time", "level", "logger", "message"} <= set(o) for o in objs)
    assert all(o["worker"].startswith("celeriac-") for o in objs)
    assert not any(o["level"] == "CRITICAL" for o in objs)
    # Control characters are escaped as in the text format: the field holds
    # the escaped text, so no id can break a line.
    # An id that itself holds "] " is cut there in the field (the message keeps
    # it whole): the field is read from the line, as a log parser would.
    shown = {"new\nline": "new\\nline", "\x1b[31mred": "\\x1b[31mred", "a] b": "a"}
    for tid in IDS:
        mine = [o for o in objs if o.get("task_id") == shown.get(tid, tid)]
        assert len(mine) == 2, (tid, mine)
        assert mine[0]["message"].endswith("] received")
        assert "] succeeded in " in mine[1]["message"]
        assert all(o["task_name"] == "llm.generate" and o["logger"].startswith("celeriac.")
                   for o in mine)
    assert any(o["message"].startswith("celeriac-") and "(celeriac): transport" in o["message"]
               for o in objs)


def test_log_format_from_the_environment_and_text_by_default(env):
    w = env.worker(start=False, env={"CELERIAC_LOG_FORMAT": "json"})
    w.start(wait_ready=False)
    w.wait_for(r' ready\.",')
    assert all(json.loads(line) for line in w.log().split("\n") if line)
    t = env.worker()  # text, with Celery's banner
    assert "[queues]" in t.log() and not t.log().lstrip().startswith("{")
