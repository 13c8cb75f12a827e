#!/usr/bin/python3
"""ab.py -- this tree's worker against a baseline build, in one run (BENCH_BASELINE=<rev>).

    /usr/bin/python3 bench/ab.py SERVICES_DIR OUT_DIR BASELINE_BIN BASELINE_LABEL
    (scripts/bench.sh calls this when BENCH_BASELINE is set)

Runs run.py's celeriac workloads on build/celeriac ("new") and on BASELINE_BIN, with the
same services, fake LLM server and tools, alternating the order from one repetition to
the next (new, baseline; baseline, new; ...) so that a drift of the machine falls on both:

  dispatch  N pre-published celery.accumulate(1), then llm.generate against the fake with
            0 ms latency and 16 tokens, over RabbitMQ and then over the Redis broker (what
            the worker pops per second there): tasks/s, and worker CPU per task (user +
            system CPU over the tasks done)
  memory    idle RSS after `ready.`, and RSS per held stream: (RSS while all N streams
            are open at the server - idle RSS) / N, at the top memory level

Each figure is the median over BENCH_REPEAT repetitions (3; 1 with BENCH_QUICK=1).
BENCH_AB_DISPATCH=accumulate,llm_zero,... runs those dispatch workloads only (labels
as in the table; "accumulate over Redis" is spelt accumulate_redis). Over RabbitMQ the
table also shows the broker's CPU per task: there the broker, not the worker, sets the
rate, so a rate that moves while both CPU figures stay is the broker's noise.
Prints the table with new/baseline, and writes OUT_DIR/results.json (key "ab", every
run's record included) and OUT_DIR/table.md. BENCH_ONLY=dispatch or =memory runs one
part. Every process started here is stopped here.
"""
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the harness: Bench, Proc, the workload sizes)

# Within this much of the baseline counts as unchanged (issue 14 asks for 5%).
TOLERANCE = 0.05


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def git_label():
    try:
        return subprocess.run(["git", "-C", run.ROOT, "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


class AB:
    def __init__(self, bench, bins):
        self.b = bench
        self.bins = bins  # {"new": path, "baseline": path}
        self.runs = {side: {"dispatch": {}, "idle_kb": [], "held": []} for side in bins}

    def order(self, rep):
        sides = ["new", "baseline"]
        return sides if rep % 2 == 0 else sides[::-1]

    def use(self, side):
        # run.Bench.celeriac() reads the module's BIN each time it starts a worker.
        run.BIN = self.bins[side]

    def dispatch(self):
        run.log("A/B dispatch: %d pre-published tasks, ready -> last result stored, "
                "%d repetitions" % (run.N_DISPATCH, run.REPEAT))
        want = os.environ.get("BENCH_AB_DISPATCH")
        want = set(want.split(",")) if want else None
        for label, broker, task, args, kwargs in (
                ("accumulate", "amqp", "celery.accumulate", [1], {}),
                ("llm_zero", "amqp", "llm.generate", ["bench"], {"model": run.LLM_ZERO}),
                ("accumulate over Redis", "redis", "celery.accumulate", [1], {}),
                ("llm_zero over Redis", "redis", "llm.generate", ["bench"],
                 {"model": run.LLM_ZERO})):
            if want is not None and label.replace(" over Redis", "_redis") not in want:
                continue
            for rep in range(run.REPEAT):
                for side in self.order(rep):
                    self.use(side)
                    run.log("  [%s] %s" % (side, label))
                    r = self.b.run_tasks("celeriac", "libuv", run.DISPATCH_C, task, args,
                                         kwargs, run.N_DISPATCH, 120, broker=broker)
                    r["side"] = side
                    r.pop("timeline", None)
                    self.runs[side]["dispatch"].setdefault(label, []).append(r)

    def idle_rss(self, c):
        w = self.b.celeriac(self.b.new_queue(), c)
        try:
            w.wait_ready()
            time.sleep(1.0)
            return run.status_kb(w.p.pid, "VmRSS")
        finally:
            w.stop()

    def memory(self):
        c = max(run.MEM_LEVELS)
        model = "fake/ttft_ms=%d,tokens=32,tps=0" % run.MEM_HOLD_MS
        run.log("A/B memory: idle RSS, and RSS with %d streams held %d ms, %d repetitions" % (
            c, run.MEM_HOLD_MS, run.REPEAT))
        for rep in range(run.REPEAT):
            for side in self.order(rep):
                self.use(side)
                idle = self.idle_rss(c)
                run.log("  [%s] idle RSS %.1f MB" % (side, idle / 1024))
                r = self.b.run_tasks("celeriac", "libuv", c, "llm.generate", ["bench"],
                                     {"model": model}, c, 120, hold_for=c)
                r["side"] = side
                r["idle_kb"] = idle
                r["held_per_stream_b"] = (round((r["held_rss_kb"] - idle) * 1024 / c)
                                          if r.get("held_rss_kb") else None)
                r["per_stream_b"] = round((r["hwm_kb"] - idle) * 1024 / c)
                r.pop("timeline", None)
                self.runs[side]["idle_kb"].append(idle)
                self.runs[side]["held"].append(r)

    def figures(self):
        """[(name, unit, higher_is_better, {side: median}, {side: [values]})]"""
        rows = []
        for label in ("accumulate", "llm_zero", "accumulate over Redis", "llm_zero over Redis"):
            per = {s: self.runs[s]["dispatch"].get(label, []) for s in self.bins}
            if not all(per.values()):
                continue
            rate = {s: [r["rate"] for r in per[s]] for s in per}
            cpu = {s: [r["cpu_s"] / r["done"] * 1e6 if r["done"] else None for r in per[s]]
                   for s in per}
            incomplete = {s: sum(1 for r in per[s] if not r["complete"]) for s in per}
            note = "" if not any(incomplete.values()) else " (incomplete runs: %s)" % incomplete
            rows.append(("dispatch %s%s" % (label, note), "tasks/s", True, rate))
            rows.append(("worker CPU per task, %s" % label, "us", False, cpu))
            if "Redis" not in label:
                rmq = {s: [r["rabbitmq_cpu_s"] / r["done"] * 1e6
                           if r["done"] and "rabbitmq_cpu_s" in r else None for r in per[s]]
                       for s in per}
                rows.append(("RabbitMQ CPU per task, %s" % label, "us", False, rmq))
        if all(self.runs[s]["held"] for s in self.bins):
            c = self.runs["new"]["held"][0]["c"]
            rows.append(("RSS per held stream at %d" % c, "B", False,
                         {s: [r["held_per_stream_b"] for r in self.runs[s]["held"]]
                          for s in self.bins}))
            rows.append(("idle RSS", "MB", False,
                         {s: [k / 1024 for k in self.runs[s]["idle_kb"]] for s in self.bins}))
        out = []
        for name, unit, up, vals in rows:
            m = {s: med(vals[s]) for s in vals}
            ratio = (m["new"] / m["baseline"]) if m["new"] is not None and m["baseline"] else None
            if ratio is None:
                verdict = "?"
            else:
                worse = (1 - ratio) if up else (ratio - 1)
                verdict = ("worse" if worse > TOLERANCE else
                           "better" if worse < -TOLERANCE else "same")
            out.append({"figure": name, "unit": unit, "higher_is_better": up,
                        "new": m["new"], "baseline": m["baseline"], "ratio": ratio,
                        "verdict": verdict, "new_runs": vals["new"],
                        "baseline_runs": vals["baseline"]})
        return out


def fmt(v, unit):
    if v is None:
        return "-"
    if unit == "MB":
        return "%.1f" % v
    if unit == "us":
        return "%.1f" % v
    return "{:,.0f}".format(v)


def table(figs, new_label, base_label, quick, reps):
    L = ["A/B: new = %s (build/celeriac), baseline = %s; %s%d repetition%s, alternating; "
         "medians; within %d%% counts as the same." % (
             new_label, base_label, "QUICK mode, " if quick else "", reps,
             "" if reps == 1 else "s", TOLERANCE * 100),
         "",
         "| figure | unit | new | baseline | new/baseline | verdict | runs: new / baseline |",
         "|---|---|---:|---:|---:|---|---|"]
    for f in figs:
        L.append("| %s | %s | %s | %s | %s | %s | %s / %s |" % (
            f["figure"], f["unit"], fmt(f["new"], f["unit"]), fmt(f["baseline"], f["unit"]),
            "%.3f" % f["ratio"] if f["ratio"] is not None else "-", f["verdict"],
            " ".join(fmt(v, f["unit"]) for v in f["new_runs"]),
            " ".join(fmt(v, f["unit"]) for v in f["baseline_runs"])))
    return "\n".join(L) + "\n"


def main():
    svc, out, base_bin, base_label = sys.argv[1:5]
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    new_label = git_label()
    run.IMPLS = ["celeriac"]  # BENCH_IMPL does not apply: both sides are celeriac
    try:
        b = run.Bench(svc, out)
        ab = AB(b, {"new": run.BIN, "baseline": base_bin})
        only = os.environ.get("BENCH_ONLY", "dispatch,memory").split(",")
        machine = run.machine()
        if "dispatch" in only:
            ab.dispatch()
        if "memory" in only:
            ab.memory()
        figs = ab.figures()
        machine["load_after"] = open("/proc/loadavg").read().split()[:3]
        res = {"quick": run.QUICK, "machine": machine, "elapsed_s": round(time.time() - t0, 1),
               "ab": {"new": new_label, "new_bin": ab.bins["new"], "baseline": base_label,
                      "tolerance": TOLERANCE, "repeat": run.REPEAT, "figures": figs,
                      "runs": ab.runs}}
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(res, f, indent=1)
        text = table(figs, new_label, base_label, run.QUICK, run.REPEAT)
        with open(os.path.join(out, "table.md"), "w") as f:
            f.write(text)
        print(text)
    finally:
        run.cleanup()
    run.log("bench: A/B done in %.0f s; results in %s" % (time.time() - t0, out))


if __name__ == "__main__":
    main()
