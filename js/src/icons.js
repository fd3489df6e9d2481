// The runs' icon, one LabIcon for the runs panel's tab, a run's page and the runs table.

import { LabIcon } from "@jupyterlab/ui-components";

// A play button in a circle: runs, in the sidebar's size and colour.
export const runsIcon = new LabIcon({
  name: "jupyter-agentruns:runs",
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161"><path d="M12 2a10 10 0 1 0 0 20 10 10 0 0 0 0-20zm0 2a8 8 0 1 1 0 16 8 8 0 0 1 0-16z"/>' +
    '<path d="M10 8v8l6-4z"/></g></svg>',
});
