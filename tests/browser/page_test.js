// page_test.js -- the gateway's web page in Debian's headless Chromium: type a
// prompt, see the answer grow token by token, see the final state and timings.
//
//   GATEWAY_URL=http://127.0.0.1:PORT/ EXPECTED="..." node page_test.js
// Optional: PROMPT, MODEL, TOKEN. Exits 0 on success, 1 with a reason.
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const { chromium } = require("playwright-core");

const url = process.env.GATEWAY_URL;
const expected = process.env.EXPECTED;
const prompt = process.env.PROMPT || "Tell me a story";

function fail(msg) {
  console.error("page_test: FAIL: " + msg);
  process.exitCode = 1;
}

async function main() {
  if (!url || expected === undefined) throw new Error("GATEWAY_URL and EXPECTED are required");
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "celeriac-chromium-"));
  // A fresh profile (--user-data-dir) each run; playwright passes it itself.
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  try {
    const page = await browser.newPage();
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    const requests = [];
    page.on("request", (r) => requests.push(r.url()));
    await page.goto(url + (process.env.TOKEN ? "?token=" + process.env.TOKEN : ""));
    await page.fill("#prompt", prompt);
    if (process.env.MODEL) await page.fill("#model", process.env.MODEL);
    await page.click("#send");

    // Sample the answer while it streams: it must grow in several steps.
    const lengths = [];
    const deadline = Date.now() + 30000;
    let state = "";
    while (Date.now() < deadline) {
      const len = (await page.textContent("#answer")).length;
      if (!lengths.length || lengths[lengths.length - 1] !== len) lengths.push(len);
      state = await page.textContent("#state");
      if (["SUCCESS", "FAILURE", "REVOKED", "ERROR"].includes(state)) break;
      await page.waitForTimeout(40);
    }
    const answer = await page.textContent("#answer");
    const total = await page.textContent("#total");
    const ttft = await page.textContent("#ttft");
    const task = await page.textContent("#task");
    const growing = lengths.filter((n) => n > 0 && n < expected.length);
    console.log("page_test: state=%s task=%s ttft=%s total=%s steps=%j", state, task, ttft,
                total, lengths);
    if (state !== "SUCCESS") fail("final state " + state + " " + (await page.textContent("#error")));
    if (answer !== expected) fail("answer " + JSON.stringify(answer) + " != " + JSON.stringify(expected));
    if (growing.length < 2) fail("the answer did not grow over time: " + JSON.stringify(lengths));
    if (!/s$/.test(total) || !/s$/.test(ttft)) fail("timings not shown: " + ttft + " / " + total);
    const base = new URL(url);
    const foreign = requests.filter((r) => new URL(r).host !== base.host);
    if (foreign.length) fail("the page loaded something from elsewhere: " + foreign.join(", "));
    if (errors.length) fail("page errors: " + errors.join("; "));
  } finally {
    await browser.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
}

main().catch((e) => { fail(e && e.stack ? e.stack : String(e)); });
