#!/usr/bin/env node
// sqs_emu.js -- the local Amazon SQS the integration tests run against:
// npm's local-aws-sqs (pinned in tests/sqs-emu/package.json, installed by
// scripts/install-deps.sh) behind a small HTTP front of our own.
//
//   node scripts/sqs_emu.js [--port N] [--log FILE] [--no-fix] [--exit-with-stdin]
//
//   --port N           port on 127.0.0.1 (else $PORT; 0 or none: a free one)
//   --log FILE         appends one JSON line per request (else $SQS_EMU_LOG)
//   --no-fix           passes requests through unchanged (else $SQS_EMU_FIX=0)
//   --exit-with-stdin  exits when stdin closes: a test harness that dies takes
//                      the emulator with it
//
// Prints "sqs-emu: listening on http://127.0.0.1:PORT" once it accepts
// requests. State is in memory only: a restart starts empty.
//
// Why a front: kombu 5.2.4's worker (Debian 12's) sends its ReceiveMessage in
// the old query style, POSTed to the queue's own URL with no QueueUrl
// parameter. local-aws-sqs finds the queue only through that parameter,
// answers NonExistentQueue, and the Python worker stops on that error
// (docs: sqs-broker.md section 12). The front adds QueueUrl, taken from the
// request's path, to such requests; requests that carry one, JSON-protocol
// requests and requests to "/" are passed on untouched.
"use strict";

const fs = require("fs");
const http = require("http");
const path = require("path");
const { PassThrough } = require("stream");

const JSON_TYPE = "application/x-amz-json-1.0";

function parseArgs(argv) {
    const o = {
        port: process.env.PORT || "0",
        log: process.env.SQS_EMU_LOG || "",
        fix: process.env.SQS_EMU_FIX !== "0",
        exitWithStdin: false,
    };
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i];
        if (a === "--port" && i + 1 < argv.length) o.port = argv[++i];
        else if (a === "--log" && i + 1 < argv.length) o.log = argv[++i];
        else if (a === "--no-fix") o.fix = false;
        else if (a === "--exit-with-stdin") o.exitWithStdin = true;
        else {
            process.stderr.write(`sqs-emu: unknown argument '${a}'\n`);
            process.exit(2);
        }
    }
    if (!/^\d+$/.test(String(o.port)) || Number(o.port) > 65535) {
        process.stderr.write(`sqs-emu: bad port '${o.port}'\n`);
        process.exit(2);
    }
    o.port = Number(o.port);
    return o;
}

// The package lives beside the other test-only npm trees, not in scripts/,
// so node's own lookup from this file would not find it.
function loadEmulator() {
    const dir =
        process.env.SQS_EMU_MODULES || path.join(__dirname, "..", "tests", "sqs-emu", "node_modules");
    try {
        return require(path.join(dir, "local-aws-sqs"));
    } catch (e) {
        process.stderr.write(
            `sqs-emu: cannot load local-aws-sqs from '${dir}': ${e.message}\n` +
                "sqs-emu: run scripts/install-deps.sh (make deps)\n"
        );
        process.exit(1);
    }
}

// The query-protocol request kombu 5.2.4 sends to a queue URL lacks QueueUrl;
// returns the body with it added, or null when the request needs nothing.
// The JSON test mirrors the emulator's own (an exact Content-Type match).
function addQueueUrl(req, body) {
    const urlPath = req.url.split("?")[0];
    if (req.headers["content-type"] === JSON_TYPE || urlPath === "/" || urlPath === "") return null;
    const has = body.split("&").some((kv) => kv.startsWith("QueueUrl="));
    if (has) return null;
    const url = `http://${req.headers.host}${urlPath}`;
    return { url, body: (body ? body + "&" : "") + "QueueUrl=" + encodeURIComponent(url) };
}

function actionOf(req, body) {
    const target = req.headers["x-amz-target"];
    if (target) return target.split(".").pop();
    const m = /(?:^|&)Action=([^&]*)/.exec(body);
    return m ? decodeURIComponent(m[1].replace(/\+/g, " ")) : "";
}

function main() {
    const opt = parseArgs(process.argv.slice(2));
    const { createRequestHandler } = loadEmulator();
    // Region fixed: the package would otherwise follow AWS_REGION from the
    // environment, and the queue ARNs with it.
    const { service, requestHandler } = createRequestHandler({
        port: opt.port,
        hostname: "127.0.0.1",
        region: "us-east-1",
        emulateQueueCreationLifecycle: false,
    });
    const logFd = opt.log ? fs.openSync(opt.log, "a") : null;

    const server = http.createServer((req, res) => {
        const parts = [];
        req.on("data", (c) => parts.push(c));
        req.on("end", () => {
            const received = Buffer.concat(parts).toString("utf8");
            const fixed = opt.fix ? addQueueUrl(req, received) : null;
            const body = fixed ? fixed.body : received;
            if (logFd !== null) {
                const started = Date.now();
                const end = res.end.bind(res);
                res.end = (chunk, ...rest) => {
                    const entry = {
                        t: started,
                        ms: Date.now() - started,
                        method: req.method,
                        path: req.url,
                        action: actionOf(req, received),
                        json: req.headers["content-type"] === JSON_TYPE,
                        body: received,
                        added_queue_url: fixed ? fixed.url : null,
                        status: res.statusCode,
                        response: typeof chunk === "string" || Buffer.isBuffer(chunk) ? String(chunk) : "",
                    };
                    fs.writeSync(logFd, JSON.stringify(entry) + "\n");
                    return end(chunk, ...rest);
                };
            }
            // The package reads the request as a stream: hand it one that
            // yields the (possibly amended) body, with the original headers.
            const stream = new PassThrough();
            stream.headers = req.headers;
            stream.url = req.url;
            stream.method = req.method;
            stream.end(body);
            requestHandler(stream, res);
        });
    });
    server.on("error", (e) => {
        process.stderr.write(`sqs-emu: ${e.message}\n`);
        process.exit(1);
    });
    server.listen(opt.port, "127.0.0.1", () => {
        // Queue URLs are built from this: with port 0 it is known only now.
        service.PORT = server.address().port;
        process.stdout.write(`sqs-emu: listening on http://127.0.0.1:${service.PORT}\n`);
    });

    const stop = () => process.exit(0);
    process.on("SIGTERM", stop);
    process.on("SIGINT", stop);
    if (opt.exitWithStdin) {
        process.stdin.on("end", stop);
        process.stdin.on("error", stop);
        process.stdin.resume();
    }
}

main();
