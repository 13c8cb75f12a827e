"""A RabbitMQ node's control calls without a new Erlang VM each.

Every `rabbitmqctl` run boots an Erlang VM: about a second of CPU, and the
suite made hundreds of them (queue depths polled in loops, vhost batches). On
the suite's two cores that was a quarter of all the CPU the integration tests
used. ErlCtl keeps one hidden Erlang node per test process, started on first
use, that evaluates each expression on the RabbitMQ node over Erlang
distribution (as `rabbitmqctl eval` does) and answers on one line.

It reads RabbitMQ's internals, which change between versions: every caller
falls back to `rabbitmqctl` when a call fails, so a node it cannot read is only
slower. It exits when its stdin closes (the test process ended) and carries
the run's directory in its command line, for run-integration.sh's cleanup.
"""
import os
import re
import select
import subprocess
import threading
import uuid

# One expression per line in, "ok TERM" or "error TERM" out (the term printed
# by ~p, folded onto one line).
_LOOP = r"""
Node = list_to_atom(os:getenv("CTL_NODE")),
Flat = fun(T) -> re:replace(io_lib:format("~p", [T]), "\\s*\\n\\s*", " ",
                            [global, {return, list}]) end,
Loop = fun Loop() ->
    case io:get_line("") of
        eof -> halt(0);
        {error, _} -> halt(0);
        Line ->
            Out = try
                {ok, Toks, _} = erl_scan:string(Line),
                {ok, Exprs} = erl_parse:parse_exprs(Toks),
                case rpc:call(Node, erl_eval, exprs, [Exprs, []], 60000) of
                    {value, V, _} -> "ok " ++ Flat(V);
                    Other -> "error " ++ Flat(Other)
                end
            catch C:E -> "error " ++ Flat({C, E})
            end,
            io:put_chars([Out, $\n]),
            Loop()
    end
end,
Loop().
"""

# The queue counters list_queues prints, read from the queues themselves.
COUNTERS = ("messages", "messages_ready", "messages_unacknowledged")


def _bin(s):
    return '<<"%s">>' % s.replace("\\", "\\\\").replace('"', '\\"')


class ErlCtl:
    def __init__(self, node, run_dir):
        self.node = node
        self.run_dir = run_dir
        self.proc = None
        self.broken = False  # could not start, or the node never answered it
        self.answered = False
        self.lock = threading.Lock()

    def _start(self):
        cookie_file = os.environ.get("CELERIAC_ERLANG_COOKIE",
                                     "/var/lib/rabbitmq/.erlang.cookie")
        try:
            with open(cookie_file) as f:
                cookie = f.read().strip()
            env = dict(os.environ, CTL_NODE=self.node)
            name = "celeriac_ctl_%d_%s@localhost" % (os.getpid(), uuid.uuid4().hex[:6])
            self.proc = subprocess.Popen(
                ["erl", "-sname", name, "-hidden", "-noshell", "-setcookie", cookie,
                 "-celeriac_run", self.run_dir, "-eval", _LOOP],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env=env, text=True, bufsize=1)
        except (OSError, ValueError):
            self.broken = True

    def eval(self, expr, timeout=90):
        """The value of expr (an Erlang expression sequence, ending in '.') on
        the node, as ~p prints it; None when it could not be had (the caller
        then asks rabbitmqctl)."""
        with self.lock:
            if self.broken:
                return None
            if self.proc is None or self.proc.poll() is not None:
                self._start()
                if self.broken:
                    return None
            try:
                self.proc.stdin.write(expr.replace("\n", " ") + "\n")
                self.proc.stdin.flush()
                ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
                line = self.proc.stdout.readline() if ready else ""
            except OSError:
                line = ""
            if not line:
                # no answer: this node is lost for good; rabbitmqctl from now on
                self.close()
                self.broken = True
                return None
            kind, _, term = line.rstrip("\n").partition(" ")
            if kind != "ok":
                # a node down (an outage test) answers later; one never reached
                # by this node (another Erlang, another cookie) is left alone
                if not self.answered and "nodedown" in term:
                    self.broken = True
                return None
            self.answered = True
            return term

    def list_queues(self, vhost, items):
        """rabbitmqctl's `list_queues -p VHOST name ITEM...` output (tab-separated
        lines) for items among COUNTERS; None when it could not be had."""
        expr = ("Items = [%s], [[element(4, amqqueue:get_name(Q)) | "
                "[proplists:get_value(I, rabbit_amqqueue:info(Q, Items)) || I <- Items]] "
                "|| Q <- rabbit_amqqueue:list(%s)]."
                % (",".join(items), _bin(vhost)))
        term = self.eval(expr)
        if term is None:
            return None
        rows = []
        for name, values in re.findall(r'\[<<"((?:[^"\\]|\\.)*)">>((?:,\s*\d+)*)\]', term):
            nums = re.findall(r"\d+", values)
            if len(nums) != len(items):
                return None
            rows.append("\t".join([name] + nums))
        if len(rows) != term.count('[<<"'):
            return None  # a row not as expected (a queue that did not answer)
        return "".join(r + "\n" for r in rows)

    def close(self):
        if self.proc is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def registered(node):
    """Whether node's Erlang VM is registered with the port mapper: what the
    suite waits for before `rabbitmqctl await_startup`, instead of polling
    `rabbitmqctl ping` (an Erlang VM a try)."""
    r = subprocess.run(["epmd", "-names"], capture_output=True, text=True, timeout=30)
    return ("name %s " % node.split("@")[0]) in r.stdout
