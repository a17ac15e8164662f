// The draft-tree view's front end (lab/viz/inspector.py, TreeView). Python draws the SVG or a phase
// (lab/viz/drawing.py, lab/viz/phases.py); this shows it and reports clicks on nodes and, while the
// view has focus, the arrow keys (step forward and back) and T (the whole tree or the phase) back to
// Python. Escape gives the focus back to the notebook. The notebook's own shortcuts are suppressed
// only inside the view. Bundled with the package: nothing is fetched at run time.
const KEYS = ["ArrowRight", "ArrowLeft", "t", "T"];

function render({ model, el }) {
  const draw = () => {
    el.innerHTML = model.get("svg");
  };
  const click = (event) => {
    el.focus();
    const node = event.target.closest("[data-node]");
    if (node) {
      model.send({ click: Number(node.dataset.node) });
    }
  };
  const key = (event) => {
    if (KEYS.includes(event.key)) {
      model.send({ key: event.key.length === 1 ? event.key.toLowerCase() : event.key });
    } else if (event.key === "Escape") {
      el.blur();
    } else {
      return;
    }
    event.preventDefault();
    event.stopPropagation();
  };
  el.classList.add("lab-draft-tree");
  el.style.overflowX = "auto";
  el.tabIndex = 0;
  el.setAttribute("role", "region");
  el.setAttribute("aria-label", "decoding cycle: arrow keys step through the phases, T shows the whole tree, "
    + "Escape returns to the notebook");
  el.dataset.lmSuppressShortcuts = "true";  // JupyterLab's and Notebook 7's keys stay out of the view
  el.addEventListener("click", click);
  el.addEventListener("keydown", key);
  model.on("change:svg", draw);
  draw();
  return () => {
    model.off("change:svg", draw);
    el.removeEventListener("click", click);
    el.removeEventListener("keydown", key);
  };
}

export default { render };
