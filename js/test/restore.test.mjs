// Bringing back run outputs that a refresh lost before the notebook was saved.
import assert from "node:assert/strict";
import { test } from "node:test";

import { MIME_TYPE } from "../src/record.js";
import { PAGE_SIZE, goneRuns, lostRuns, restoreOutputs, runOutput, runsSince, shownRunIds, unsavedCodeNotice } from "../src/restore.js";
import { sha256Hex } from "../src/sha256.js";

const SAVED = "2026-03-01T10:00:00.000000Z";

function run(id, cellId, createdAt, fields = {}) {
  return {
    run_id: id, agent: "demo", status: "running", last_seq: 5, created_at: createdAt,
    metadata: cellId === null ? {} : { cell_id: cellId }, ...fields,
  };
}

/** A server that answers the runs list in pages (newest first) and records as Markdown. */
function fakeServer(runs, { pageSize = PAGE_SIZE } = {}) {
  const requests = [];
  const fetch = async (url, init) => {
    requests.push({ url, init });
    const parsed = new URL(url, "http://localhost");
    if (parsed.pathname.endsWith("/api/agentruns/runs")) {
      const start = parsed.searchParams.has("before") ? Number(parsed.searchParams.get("before")) : 0;
      const page = runs.slice(start, start + pageSize);
      const next = start + pageSize < runs.length ? String(start + pageSize) : null;
      return Response.json({ runs: page, next });
    }
    const id = decodeURIComponent(parsed.pathname.split("/").pop());
    assert.equal(init.headers.Accept, "text/markdown");
    return new Response(`record of ${id}`, { headers: { "Content-Type": "text/markdown; charset=UTF-8" } });
  };
  return { fetch, requests };
}

const cells = (...specs) => specs.map(([id, runIds = [], type = "code", source = "run()"]) => ({ id, type, runIds, source }));

test("the runs list is asked for by notebook path, under the base URL", async () => {
  const server = fakeServer([run("run_1", "c1", "2026-03-01T10:05:00Z")]);
  await runsSince(server.fetch, "/user/ada/", "work/My notebook.ipynb", Date.parse(SAVED));
  const url = new URL(server.requests[0].url, "http://localhost");
  assert.equal(url.pathname, "/user/ada/api/agentruns/runs");
  assert.equal(url.searchParams.get("notebook"), "work/My notebook.ipynb");
  assert.equal(server.requests[0].init.credentials, "same-origin");
});

test("pages are followed while runs are newer than the saved file, and no further", async () => {
  const runs = [
    run("run_5", "c1", "2026-03-01T10:09:00Z"),
    run("run_4", "c2", "2026-03-01T10:08:00Z"),
    run("run_3", "c3", "2026-03-01T10:07:00Z"),
    run("run_2", "c1", "2026-03-01T09:59:00Z"),
    run("run_1", "c1", "2026-03-01T09:00:00Z"),
    run("run_0", "c1", "2026-03-01T08:00:00Z"),
  ];
  const server = fakeServer(runs, { pageSize: 2 });
  const found = await runsSince(server.fetch, "/", "n.ipynb", Date.parse(SAVED));
  assert.deepEqual(found.map((r) => r.run_id), ["run_5", "run_4", "run_3"]);
  assert.equal(server.requests.length, 2, "the second page reached runs older than the file");
  assert.equal(new URL(server.requests[1].url, "http://localhost").searchParams.get("before"), "2");
});

test("each code cell gets its newest run, unless it shows it already", () => {
  const runs = [
    run("run_new", "c1", "2026-03-01T10:09:00Z"),
    run("run_old", "c1", "2026-03-01T10:01:00Z"),
    run("run_shown", "c2", "2026-03-01T10:05:00Z"),
    run("run_md", "m1", "2026-03-01T10:05:00Z"),
    run("run_gone", "deleted-cell", "2026-03-01T10:05:00Z"),
    run("run_nocell", null, "2026-03-01T10:05:00Z"),
  ];
  const lost = lostRuns(cells(["c1"], ["c2", ["run_shown"]], ["m1", [], "markdown"], ["c3"]), runs);
  assert.deepEqual(lost.map(({ cellId, run, unsaved }) => [cellId, run.run_id, unsaved]), [["c1", "run_new", false]]);
  const gone = goneRuns(cells(["c1"], ["c2", ["run_shown"]], ["m1", [], "markdown"], ["c3"]), runs);
  assert.deepEqual(gone.map((r) => r.run_id), ["run_md", "run_gone"]);
});

test("the cell's code is compared with the code that submitted the run, as Python hashes it", () => {
  // hashlib.sha256("x = 1\nprint('héllo 🎉')".encode()).hexdigest()
  assert.equal(sha256Hex("x = 1\nprint('héllo 🎉')"), "502b02c7937d21e829d3abd8d2ce8c89bf422a7791fde7752a1cb50acadc44df");
  const submitted = "submit('demo', {'prompt': 'edited'})";
  const made = run("run_e", "c1", "2026-03-01T10:09:00Z", {
    metadata: { cell_id: "c1", cell_source_sha256: sha256Hex(submitted), cell_source: submitted },
  });
  const [same] = lostRuns(cells(["c1", [], "code", submitted]), [made]);
  assert.equal(same.unsaved, false);
  const [other] = lostRuns(cells(["c1", [], "code", "submit('demo', {'prompt': 'saved'})"]), [made]);
  assert.equal(other.unsaved, true);
  const notice = unsavedCodeNotice(made);
  assert.equal(notice.data["text/markdown"], `**This run came from code you did not save:**\n\n\`\`\`\n${submitted}\n\`\`\``);
  assert.equal(notice.data["text/plain"], `This run came from code you did not save:\n${submitted}`);
  assert.deepEqual(notice.metadata, { agentruns: { unsaved_code_of: "run_e" } });
  const fenced = unsavedCodeNotice({ ...made, metadata: { ...made.metadata, cell_source: "x = '```'" } });
  assert.match(fenced.data["text/markdown"], /\n````\nx = '```'\n````$/);
  const long = unsavedCodeNotice({ ...made, metadata: { cell_id: "c1", cell_source_sha256: "ab" } });
  assert.equal(long.data["text/plain"], "This run came from code you did not save.");
});

test("a restored output carries our mime data, the record and text", () => {
  const output = runOutput(run("run_x", "c1", SAVED, { status: "succeeded", last_seq: 42 }), "**demo** succeeded");
  assert.deepEqual(output, {
    output_type: "display_data",
    data: {
      [MIME_TYPE]: { run_id: "run_x", status: "succeeded", last_seq: 42, agent: "demo" },
      "text/plain": "Run(run_id='run_x', status='succeeded')",
      "text/markdown": "**demo** succeeded",
    },
    metadata: {},
  });
  assert.equal("text/markdown" in runOutput(run("run_x", "c1", SAVED), null).data, false);
});

test("the run ids shown are read from a cell's outputs", () => {
  const outputs = [
    { output_type: "stream", text: "hi" },
    { output_type: "display_data", data: { [MIME_TYPE]: { run_id: "run_a" } } },
    { output_type: "display_data", data: { "text/plain": "x" } },
  ];
  assert.deepEqual(shownRunIds(outputs), ["run_a"]);
});

test("a refresh before saving: the run goes back into its cell; cleared cells stay cleared", async () => {
  const server = fakeServer([
    run("run_after", "c1", "2026-03-01T10:00:30Z"),
    run("run_before", "c2", "2026-03-01T09:58:00Z"), // the user cleared it, then saved
  ]);
  const restored = await restoreOutputs({
    fetch: server.fetch, baseUrl: "/", path: "n.ipynb", lastModified: SAVED, cells: cells(["c1"], ["c2"]),
  });
  assert.equal(restored.restored.length, 1);
  assert.equal(restored.restored[0].cellId, "c1");
  assert.equal(restored.restored[0].outputs.length, 1);
  assert.equal(restored.restored[0].outputs[0].data["text/markdown"], "record of run_after");
  assert.equal(restored.restored[0].outputs[0].data[MIME_TYPE].run_id, "run_after");
  assert.deepEqual(restored.gone, []);
});

test("a run of code that was not saved comes back below a notice; runs of cells that are gone are handed back", async () => {
  const server = fakeServer([
    run("run_new_cell", "c9", "2026-03-01T10:02:00Z"),
    run("run_edited", "c1", "2026-03-01T10:01:00Z", { metadata: { cell_id: "c1", cell_source_sha256: sha256Hex("edited()"), cell_source: "edited()" } }),
  ]);
  const { restored, gone } = await restoreOutputs({
    fetch: server.fetch, baseUrl: "/", path: "n.ipynb", lastModified: SAVED, cells: cells(["c1", [], "code", "saved()"]),
  });
  assert.deepEqual(restored[0].outputs.map((output) => Object.keys(output.data)[0]), ["text/markdown", MIME_TYPE]);
  assert.match(restored[0].outputs[0].data["text/plain"], /did not save:\nedited\(\)$/);
  assert.deepEqual(gone.map((r) => r.run_id), ["run_new_cell"]);
});

test("an up-to-date notebook asks for nothing but the list, and changes nothing", async () => {
  const server = fakeServer([run("run_a", "c1", "2026-03-01T10:03:00Z")]);
  const restored = await restoreOutputs({
    fetch: server.fetch, baseUrl: "/", path: "n.ipynb", lastModified: SAVED, cells: cells(["c1", ["run_a"]]),
  });
  assert.deepEqual(restored, { restored: [], gone: [] });
  assert.equal(server.requests.length, 1);
});

test("without a saved file's time nothing is restored", async () => {
  const server = fakeServer([run("run_a", "c1", "2026-03-01T10:03:00Z")]);
  assert.deepEqual(await restoreOutputs({ fetch: server.fetch, baseUrl: "/", path: "n.ipynb", lastModified: null, cells: cells(["c1"]) }), { restored: [], gone: [] });
  assert.equal(server.requests.length, 0);
});

test("a server that cannot list runs is an error for the caller to log", async () => {
  const fetch = async () => Response.json({ error: "invalid_request" }, { status: 400 });
  await assert.rejects(
    restoreOutputs({ fetch, baseUrl: "/", path: "n.ipynb", lastModified: SAVED, cells: cells(["c1"]) }),
    /answered 400/
  );
});
