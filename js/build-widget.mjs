// Bundle the anywidget module and its CSS into the Python package.
import { build } from "esbuild";

const outdir = new URL("../jupyter_agentruns/static/", import.meta.url).pathname;

await build({
  entryPoints: { widget: "src/widget.js" },
  bundle: true,
  format: "esm",
  target: "es2020",
  minify: true,
  sourcemap: false,
  legalComments: "eof",
  outdir,
  logLevel: "warning",
});
await build({
  entryPoints: { widget: "src/widget.css" },
  bundle: true,
  minify: false,
  outdir,
  logLevel: "warning",
});
