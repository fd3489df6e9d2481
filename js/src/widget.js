// The anywidget module of the Python `Run` widget.
//
// `initialize` runs once per model, whether or not a view of it is ever
// shown: with the labextension installed, the renderer shows the run and
// finds the model through the registry to keep the kernel informed.

import { registerModel } from "./models.js";
import { RunView, modelHost, syncFor } from "./view.js";

/** @typedef {import("./models.js").WidgetModel} WidgetModel */

export default {
  /** @param {{model: WidgetModel}} context */
  initialize({ model }) {
    const unregister = registerModel(model);
    return () => {
      unregister();
      syncFor(model).dispose();
    };
  },

  /** @param {{model: WidgetModel, el: HTMLElement}} context */
  render({ model, el }) {
    const host = modelHost(model);
    const view = new RunView(host, el);
    view.attach(host.runId());
    return () => view.dispose();
  },
};
